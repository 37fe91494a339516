"""Container images: pulled with one shared backoff and, for a batch, ahead of the tasks that need them, within a
disk budget, with a ledger of what the batch pulled.

    pull()        one image, retried with backoff; a registry's rate limit (429, `toomanyrequests`) pauses every
                  pull from that registry in this process together (PullGate), as models/gate.py does for a model
    ImagePool     one engine's images for a batch on this machine: pulls the images of the next queued tasks
                  while workers run (bounded: pulls at once, images ahead), counts the disk the batch's pulls took,
                  and removes the batch's own images that no queued or running task needs, least recently used
                  first, to stay within the budget
    ImageLedger   RUN_DIR/images.jsonl: each pull begun, ended and removed, so a rerun (after a kill -9 too) knows
                  which images this batch pulled (its to remove) from those that were there before (never removed)
    BatchImages   the pools of a batch (one per engine executable), as the scheduler and the workers use them
    prepull()     `miniswe images TASKS`: every image a task list needs, pulled once before many runs

The disk a batch's images take is what `docker system df` reports for images (shared layers counted once) above
what was there when the batch began; sizes are decimal (1G = 10^9 bytes), as the engines print them.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from miniswe.environments.containers import engine_call, engine_problem, first_line
from miniswe.errors import Cancelled, PullError, SandboxError, UsageError
from miniswe.signals import Stop

POLL_S = 0.25  # how often a task waiting for its image looks at its Stop
DF_TRIES = 20  # `system df` asked again while another one runs (about 10 s in all)
REMOVE_RETRY_S, REMOVE_TRIES = 1.0, 30  # an image a container still uses: removal tried again, for half a minute
LEDGER = "images.jsonl"
UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12,
         "tb": 10**12, "ki": 2**10, "kib": 2**10, "mi": 2**20, "mib": 2**20, "gi": 2**30, "gib": 2**30, "ti": 2**40,
         "tib": 2**40}

# What an engine's pull error says, read as how to go on. Only the CLI's text is there to read: neither docker nor
# podman passes a registry's Retry-After on, so a rate limit is waited out by the backoff.
RATE_LIMITED = re.compile(r"toomanyrequests|too many requests|\b429\b|rate limit", re.IGNORECASE)
DISK_FULL = re.compile(r"no space left on device|disk quota exceeded", re.IGNORECASE)
# a retry cannot help: the name, the credentials, the registry's protocol, or a host that does not resolve (offline)
PERMANENT = re.compile(
    r"manifest unknown|not found|does not exist|name unknown|unauthorized|denied|invalid reference|"
    r"repository name must|no such host|gave http response to https client|x509|certificate", re.IGNORECASE)


@dataclass
class PullPolicy:
    tries: int = 5  # pulls of one image before it counts as failed (a rate limit's and a network's alike)
    backoff_s: float = 5.0  # the wait after a failed pull, doubled after each further one...
    max_backoff_s: float = 300.0  # ...up to this
    timeout_s: float = 3600.0  # one pull: an 8 GB image on a slow link takes a while

    def delay(self, attempt: int) -> float:
        """The wait after failed pull number `attempt` (from 1), jittered within the ceiling so that pulls that
        failed together do not all come back at once."""
        base = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1))
        return min(self.max_backoff_s, base * random.uniform(0.9, 1.1))


@dataclass
class ImagePolicy(PullPolicy):
    budget: int = 0  # bytes the batch's own images may take on one machine; 0: no budget
    prefetch: int = 2  # images of queued tasks to pull before those tasks start; 0: each when its task starts
    max_pulls: int = 2  # pulls at once on one machine
    min_free: int = 10**9  # free bytes to keep on the engine's disk: below that, no pull starts


def parse_size(text: str | int | float, what: str = "--image-budget") -> int:
    """Bytes from `50G`, `500MB`, `1.5T`, `2GiB` or a plain number of bytes (decimal units, as docker prints)."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return int(text)
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(text))
    unit = match and UNITS.get(match[2].lower())
    if not match or unit is None:
        raise UsageError(f"{what} {text!r}: not a size; write e.g. 50G, 500M or 2GiB")
    return int(float(match[1]) * unit)


def human(size: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(size) < 1000 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} TB"


# -- names, registries and the engine's answers ----------------------------------------------------------------
def normal(name: str) -> str:
    """An image reference as engines list it: `python` is `python:latest`, Docker Hub's prefixes dropped."""
    name = name.strip()
    if "@" not in name and ":" not in name.rsplit("/", 1)[-1]:
        name += ":latest"
    for prefix in ("docker.io/library/", "index.docker.io/library/", "docker.io/", "index.docker.io/"):
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


def registry_of(name: str) -> str:
    """The registry a reference pulls from: its first part when that names a host, else Docker Hub."""
    first, slash, _ = normal(name).partition("/")
    return first if slash and ("." in first or ":" in first or first == "localhost") else "docker.io"


def present_images(exe: str) -> set[str]:
    """Every image reference the engine holds, normalized (tags and digests)."""
    listed = engine_call(exe, "images", "--digests", "--format", "{{.Repository}}\t{{.Tag}}\t{{.Digest}}")
    if listed.returncode:
        raise SandboxError(engine_problem(os.path.basename(exe), listed.stderr))
    found = set()
    podman = "podman" in os.path.basename(exe)
    for line in listed.stdout.splitlines():
        repository, tag, digest = (line.split("\t") + ["", ""])[:3]
        if not repository or repository == "<none>":
            continue
        # podman names an image built or loaded here localhost/NAME, and runs it as NAME too
        for name in [repository] + ([repository.removeprefix("localhost/")] if podman and repository.startswith("localhost/") else []):
            if tag and tag != "<none>":
                found.add(normal(f"{name}:{tag}"))
            if digest and digest != "<none>":
                found.add(normal(f"{name}@{digest}"))
    return found


def is_present(exe: str, name: str) -> bool:
    return engine_call(exe, "image", "inspect", "--format", "{{.Id}}", name).returncode == 0


def image_disk(exe: str) -> int | None:
    """Bytes the engine's images take (`system df`: shared layers once); None when the engine does not say. dockerd
    refuses a `system df` while another runs ("a disk usage operation is already running": anyone watching the
    disk), so a refusal is asked again."""
    for attempt in range(DF_TRIES):
        try:
            done = engine_call(exe, "system", "df", "--format", "{{json .}}", timeout=60)
        except SandboxError:
            return None
        for line in done.stdout.splitlines():
            with contextlib.suppress(ValueError, AttributeError):
                row = json.loads(line)
                if row.get("Type") == "Images":
                    return parse_size(str(row.get("Size")).replace("B", ""))
        time.sleep(0.05 * (attempt + 1))
    return None


def image_size(exe: str, name: str) -> int | None:
    """An image's own size, its layers shared with others included."""
    done = engine_call(exe, "image", "inspect", "--format", "{{.Size}}", name)
    return int(done.stdout.strip()) if done.returncode == 0 and done.stdout.strip().isdigit() else None


def storage_root(exe: str) -> str | None:
    """The engine's storage folder, when it is on this machine (a remote engine's is not): its free space is what
    pulls fill."""
    template = "{{.Store.GraphRoot}}" if "podman" in os.path.basename(exe) else "{{.DockerRootDir}}"
    try:
        done = engine_call(exe, "info", "--format", template, timeout=30)
    except SandboxError:
        return None
    root = done.stdout.strip()
    if done.returncode or not root or os.environ.get("DOCKER_HOST") or not os.path.isdir(root):
        return None
    return root


def _free_bytes(root: str) -> int:
    try:
        stats = os.statvfs(root)
    except OSError:
        return 2**62  # not measurable now: no reason to hold pulls back
    return stats.f_bavail * stats.f_frsize


def classify(stderr: str) -> str:
    if DISK_FULL.search(stderr):
        return "disk"
    if RATE_LIMITED.search(stderr):
        return "rate_limit"
    if PERMANENT.search(stderr):
        return "permanent"
    return "transient"


def pull_problem(stderr: str) -> str:
    """The line of a failed pull's output that says why (the engine prints progress before it)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for line in reversed(lines):
        if "rror" in line or "denied" in line or "toomanyrequests" in line:
            return first_line(line).removeprefix("Error response from daemon: ")
    return first_line(lines[-1]).removeprefix("Error response from daemon: ") if lines else "no reason given"


# -- one pull ---------------------------------------------------------------------------------------------------
class PullGate:
    """One registry's pause, shared by every pull from it in this process: a rate limit holds them all back
    instead of each pull hammering the registry on its own schedule."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._resume_at = 0.0

    def pause(self, seconds: float) -> None:
        with self._lock:
            self._resume_at = max(self._resume_at, time.monotonic() + seconds)

    def paused_for(self) -> float:
        with self._lock:
            return self._resume_at - time.monotonic()

    def wait(self, stop: Stop | None) -> float:
        """Wait out the pause (cut short by a stop: Cancelled); the seconds waited."""
        waited = 0.0
        while (delay := self.paused_for()) > 0:
            if stop is not None and stop.wait(min(delay, POLL_S)):
                raise Cancelled("image pull cancelled while the registry asked every pull to wait")
            if stop is None:
                time.sleep(min(delay, POLL_S))
            waited += min(delay, POLL_S)
        return waited


_GATES: dict[str, PullGate] = {}
_GATES_LOCK = threading.Lock()


def gate_for(name: str) -> PullGate:
    registry = registry_of(name)
    with _GATES_LOCK:
        return _GATES.setdefault(registry, PullGate())


def pull(exe: str, name: str, *, stop: Stop | None = None, policy: PullPolicy | None = None,
         notice: Callable[[str], None] | None = None) -> float:
    """Pull `name`; the seconds the successful pull took. Failed pulls are tried again after a backoff (a rate
    limit pauses every pull from the registry); PullError once it cannot succeed or the tries are used up;
    Cancelled when `stop` asks for a stop meanwhile (an urgent one kills the pull under way)."""
    policy = policy or PullPolicy()
    tool = os.path.basename(exe)
    gate = gate_for(name)
    for attempt in range(1, policy.tries + 1):
        gate.wait(stop)
        started = time.monotonic()
        try:
            done = engine_call(exe, "pull", name, timeout=policy.timeout_s, stop=stop)
        except SandboxError as error:  # it did not finish in time: as a network failure
            done, problem, kind = None, str(error), "transient"
        else:
            if done.returncode == 0:
                return time.monotonic() - started
            problem, kind = pull_problem(done.stderr), classify(done.stderr)
            if "cannot connect" in done.stderr.lower():  # the engine itself is down: a pull cannot help
                raise PullError(f"cannot pull image {name}: {engine_problem(tool, done.stderr)}", "permanent")
        if stop is not None and stop.outcome is not None:
            raise Cancelled(f"image pull of {name} cancelled")
        if kind == "disk":
            raise PullError(f"cannot pull image {name}: the {tool} engine's disk is full ({problem}); free space "
                            f"(`{tool} image prune`), then rerun", "disk")
        if kind == "permanent":
            hint = ("the registry speaks plain HTTP: list it among the engine's insecure registries"
                    if "https client" in problem.lower() else
                    f"check the name, or build or load it locally ({tool} build / {tool} load) and set environment.pull: never")
            raise PullError(f"cannot pull image {name}: {problem}; {hint}", "permanent")
        if attempt == policy.tries:
            hint = ("the registry's pull rate limit: log in to it or wait for the limit to reset"
                    if kind == "rate_limit" else "check the registry and the network")
            raise PullError(f"cannot pull image {name}: {problem} (gave up after {policy.tries} tries); {hint}, "
                            "then rerun (a rerun pulls it again)", kind)
        delay = policy.delay(attempt)
        if kind == "rate_limit":
            gate.pause(delay)  # every pull from this registry waits with this one
            if notice:
                notice(f"miniswe: {registry_of(name)} rate-limits pulls ({problem}); every pull from it waits {delay:.0f}s")
        elif stop is not None and stop.wait(delay):
            raise Cancelled(f"image pull of {name} cancelled")
        elif stop is None:
            time.sleep(delay)
    raise AssertionError("unreachable")


# -- the ledger -------------------------------------------------------------------------------------------------
class ImageLedger:
    """RUN_DIR/images.jsonl: one JSON line per pull begun (`pulling`), ended (`pulled`, `failed`) and image removed
    (`removed`), fsynced as written, each naming its host and engine. A kill -9 tears at most the last line, which
    reading skips. An image this batch began to pull (it was not there) and that is there now is the batch's own."""

    def __init__(self, path: str):
        self.path = path
        self._lock = threading.Lock()

    def add(self, exe: str, image: str, event: str, **data: Any) -> None:
        now = time.time()
        line = json.dumps({"image": image, "event": event, "host": socket.gethostname(), "engine": os.path.basename(exe),
                           "at": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(now)) + f".{int(now * 1000) % 1000:03d}"
                           + time.strftime("%z", time.localtime(now)), **data}) + "\n"
        with self._lock:
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            except OSError:
                return  # the ledger helps a rerun tidy up; it never stops a batch
            try:
                os.write(fd, line.encode("utf-8"))
                os.fsync(fd)
            except OSError:
                pass
            finally:
                os.close(fd)

    def owned(self, exe: str) -> dict[str, int]:
        """Images of this host and engine the batch pulled and has not removed, with the bytes each pull added."""
        owned: dict[str, int] = {}
        engine, host = os.path.basename(exe), socket.gethostname()
        try:
            with open(self.path, encoding="utf-8", errors="replace") as handle:
                lines = handle.read().splitlines()
        except OSError:
            return owned
        for line in lines:
            try:
                entry = json.loads(line)
                image, event = normal(entry["image"]), entry["event"]
            except (ValueError, KeyError, TypeError, AttributeError):
                continue  # torn by a kill -9, or not ours
            if entry.get("host") != host or entry.get("engine") != engine:
                continue
            if event == "pulling" and entry.get("owned", True):
                owned.setdefault(image, 0)
            elif event == "pulled" and image in owned:
                owned[image] = int(entry.get("bytes") or 0)
            elif event == "removed":
                owned.pop(image, None)
        return owned


# -- one engine's images for a batch -----------------------------------------------------------------------------
class _Image:
    def __init__(self, name: str, present: bool):
        self.name = name  # as the tasks give it: what is pulled and removed
        self.state = "present" if present else "absent"  # absent, pulling, present, failed
        self.there_before = present  # never removed
        self.owned = False  # pulled by this batch (or an earlier invocation of it): may be removed
        self.users = 0  # tasks using it now
        self.used_at = 0.0
        self.bytes: int | None = None  # disk its pull added
        self.blocked = False  # its pull waits for room under the budget
        self.error = ""
        self.removals_failed = 0
        self.remove_after = 0.0  # a removal refused (a container still being removed uses it) is tried again then


class ImagePool:
    """The images of a batch on one engine: pulled ahead of the queue, kept within the budget.

    The scheduler says which images the unfinished tasks need, in the order they will start (`expect`); a task
    takes its image before it starts (`acquire`, waiting for its pull, or for room, when it must) and gives it
    back when it has finished and been graded (`release`). Everything is decided under one lock; pulls run in
    threads of their own."""

    def __init__(self, exe: str, policy: ImagePolicy, *, ledger: ImageLedger | None = None, stop: Stop | None = None,
                 notice: Callable[[str], None] = lambda line: None):
        self.exe = shutil.which(exe) or exe
        self.tool = os.path.basename(exe)
        self.policy = policy
        self.ledger = ledger
        self.notice = notice
        self._parent_stop = stop
        self._stop = stop.linked() if stop is not None else Stop()
        self._cond = threading.Condition()
        self._present = present_images(self.exe)
        self._root = storage_root(self.exe)
        self._images: dict[str, _Image] = {}
        self._queue: list[str] = []  # keys of the images unfinished tasks need, in the order they will start
        self._started: set[str] = set()  # of those, the images of tasks already handed to a worker
        self._waiting: dict[str, int] = {}  # keys of images tasks wait for now (in the order they began to)
        self._threads: list[threading.Thread] = []
        self._pulls = 0
        self.fatal: str | None = None  # the engine's disk is full: no task starts
        self._over_noticed = False
        self.stats = {"pulls": 0, "failed": 0, "bytes_pulled": 0, "pull_s": 0.0, "removed": 0, "rate_limited": 0}
        # the batch's own images from an earlier invocation (a rerun, after a kill -9 too): still its to remove
        owned = ledger.owned(self.exe) if ledger else {}
        held = 0
        for key, size in owned.items():
            if key in self._present:
                image = self._images[key] = _Image(key, True)
                image.there_before, image.owned, image.bytes = False, True, size or None
                held += size
        total = image_disk(self.exe)
        self._base = None if total is None else total - held  # what the engine held apart from the batch's images
        self._grown = held  # what the engine's images grew by since then, as last measured
        self.disk = held  # what the batch's images take: see _measure
        self.peak = self.disk
        _LIVE_POOLS.append(self)

    # -- what the scheduler says -----------------------------------------------------------------------------
    def expect(self, needs: Iterable[tuple[str, str]], started: int = 0) -> None:
        """The (image, pull policy) of every unfinished task: the `started` ones first (handed to a worker), then the
        others in the order they will start."""
        with self._cond:
            queue = []
            for name, pull in needs:
                image = self._image(name, pull)
                queue.append(normal(image.name))
            self._queue, self._started = queue, set(queue[:started])
            self._pump()

    def ready(self, name: str) -> bool:
        """Whether a task of `name` would start at once (its image is there)."""
        with self._cond:
            image = self._images.get(normal(name))
            return image is None or image.state == "present"

    # -- what a task does ------------------------------------------------------------------------------------
    def acquire(self, name: str, pull: str = "missing", stop: Stop | None = None,
                on_wait: Callable[[], None] | None = None) -> dict[str, Any]:
        """Hold `name` for a task, pulled first when needed; how long the task waited and for what: `pull` (its pull,
        or a pull of it under way), `budget` (room under the budget) or `none`. PullError when it cannot be pulled;
        Cancelled when `stop` asks for a stop meanwhile."""
        key = normal(name)
        started = last = time.monotonic()
        waits = {"pull": 0.0, "budget": 0.0}
        with self._cond:
            image = self._image(name, pull)
            self._waiting[key] = self._waiting.get(key, 0) + 1
            try:
                told = False
                while image.state != "present" and pull != "never":
                    if image.state == "failed":
                        raise PullError(image.error, "failed")
                    if self.fatal:
                        raise PullError(self.fatal, "disk")
                    if not told and on_wait is not None:
                        told = True
                        on_wait()
                    self._pump()
                    self._cond.wait(POLL_S)
                    now = time.monotonic()
                    waits["budget" if image.state == "absent" and image.blocked else "pull"] += now - last
                    last = now
                    if stop is not None and stop.outcome is not None:
                        raise Cancelled(f"stopped while waiting for image {name}")
                image.users += 1
                image.used_at = time.monotonic()
            finally:
                self._waiting[key] -= 1
                if not self._waiting[key]:
                    del self._waiting[key]
        waited = round(time.monotonic() - started, 3)
        kind = "budget" if waits["budget"] > 0 else "pull" if waits["pull"] > 0 else "none"
        return {"name": name, "wait": kind, "wait_s": waited if kind != "none" else 0.0,
                "pull_s": round(waits["pull"], 3), "budget_s": round(waits["budget"], 3), "bytes": image.bytes or 0}

    def release(self, name: str) -> None:
        with self._cond:
            image = self._images.get(normal(name))
            if image is not None and image.users > 0:
                image.users -= 1
                image.used_at = time.monotonic()
            self._pump()
            self._cond.notify_all()

    def holds(self, name: str) -> bool:
        """Whether a task of the batch holds `name` now (DockerEnvironment pulls no image a batch pulled for it)."""
        with self._cond:
            image = self._images.get(normal(name))
            return image is not None and image.users > 0 and image.state == "present"

    # -- deciding what to pull and what to remove (under the lock) ---------------------------------------------
    def _image(self, name: str, pull: str) -> _Image:
        key = normal(name)
        image = self._images.get(key)
        if image is None:
            present = key in self._present or ("@" in key and is_present(self.exe, name))
            image = self._images[key] = _Image(name, present)
            if present and pull == "always":
                image.state = "absent"  # pulled once per batch, and still never removed: it was there before
        return image

    def _pump(self) -> None:
        """Start the pulls that may start: first those tasks wait for, then those of the next images of the queue."""
        if self.fatal or self._stop.outcome is not None:
            return
        ahead: list[str] = []
        for key in dict.fromkeys(self._queue):
            if len(ahead) >= self.policy.prefetch:
                break
            if key not in self._waiting and self._images[key].state in ("absent", "pulling"):
                ahead.append(key)  # a pull under way counts: the look ahead is in images not yet there
        for key in dict.fromkeys([*self._waiting, *ahead]):
            image = self._images[key]
            if image.state != "absent":
                continue
            if self._pulls >= max(1, self.policy.max_pulls):
                break
            urgent = key in self._waiting
            estimate = self._estimate(image)
            if estimate is None and not urgent and self.policy.budget:
                break  # no size known yet: prefetching waits for the first pull to tell one
            if not self._room_for(estimate or 0, urgent, image):
                image.blocked = True
                break  # in queue order: a later image must not take the room an earlier one waits for
            image.blocked = False
            self._start(image)

    def _estimate(self, image: _Image) -> int | None:
        """The disk a pull will take: its own size when a pull of it told one, else the largest pull's so far."""
        if image.bytes is not None:
            return image.bytes
        known = [i.bytes for i in self._images.values() if i.bytes is not None]
        return max(known) if known else None

    def _room_for(self, estimate: int, urgent: bool, image: _Image) -> bool:
        """Whether a pull of about `estimate` bytes may start now, once what may be removed is; sets `fatal` when the
        engine's disk cannot take it and nothing will free any."""
        budget = self.policy.budget
        flying = sum(self._estimate(i) or 0 for i in self._images.values() if i.state == "pulling")
        while budget and self.disk + flying + estimate > budget and (victim := self._victim(urgent)) is not None:
            self._remove(victim)
        if budget and self.disk + flying + estimate > budget:
            # nothing of the batch's is on disk or on its way (what it held is gone): one image larger than the whole
            # budget runs alone rather than never
            if not (urgent and self._holds_nothing()):
                return False
            if not self._over_noticed:
                self._over_noticed = True
                self.notice(f"miniswe: image {image.name} may take more than the image budget ({human(budget)}): "
                            "it is pulled with none of the batch's other images on disk")
        if self._root is None:
            return True
        need = 2 * estimate + self.policy.min_free  # the download and its unpacked layers, and some to spare
        while (free := _free_bytes(self._root)) < need and (victim := self._victim(urgent)) is not None:
            self._remove(victim)
        if free >= need:
            return True
        if urgent and self._holds_nothing():  # nothing the batch could free: the disk is full with what others hold
            self.fatal = (f"the {self.tool} engine's disk is full: {human(free)} free in {self._root}, about {human(need)} "
                          f"needed to pull {image.name}; free space (`{self.tool} image prune`) or set a smaller "
                          "--image-budget, then rerun")
            self.notice(f"miniswe: {self.fatal}; no new task starts")
            self._cond.notify_all()
        return False

    def _holds_nothing(self) -> bool:
        """No pull under way and no image of the batch's own on disk: waiting frees nothing."""
        return self._pulls == 0 and not any(i.owned and i.state == "present" for i in self._images.values())

    def _removable(self) -> list[_Image]:
        now = time.monotonic()
        return [i for i in self._images.values() if i.owned and i.state == "present" and not i.users and i.remove_after <= now]

    def _victim(self, urgent: bool) -> _Image | None:
        """The image to remove for room: the batch's own, unused, that no unfinished task needs, least recently
        used first. When a task waits and nothing running will free any room (only images later tasks need hold
        it), the one needed farthest ahead goes instead: it is pulled again when its task comes."""
        soon = {*self._waiting, *self._started}  # what tasks handed to a worker take next: never removed
        candidates = [i for i in self._removable() if normal(i.name) not in soon]
        needed = set(self._queue)
        idle = [i for i in candidates if normal(i.name) not in needed]
        if idle:
            return min(idle, key=lambda i: i.used_at)
        if urgent and candidates and self._settled(soon):
            return max(candidates, key=lambda i: self._queue.index(normal(i.name)))
        return None

    def _settled(self, soon: set[str]) -> bool:
        """No pull under way, no image in use and none a started task is about to take: waiting frees no room."""
        return (self._pulls == 0 and not any(i.users for i in self._images.values())
                and not any(self._images[key].state == "present" for key in soon))

    def _remove(self, image: _Image) -> None:
        done = engine_call(self.exe, "rmi", image.name, timeout=120)
        if done.returncode and is_present(self.exe, image.name):  # a container uses it: one of the batch's, going?
            image.removals_failed += 1
            image.remove_after = time.monotonic() + REMOVE_RETRY_S
            if image.removals_failed >= REMOVE_TRIES:  # someone else's: no longer the batch's to manage
                image.owned = False
                self.notice(f"miniswe: could not remove image {image.name} ({first_line(done.stderr)}); it stays, "
                            "outside the image budget's count")
                self._recount()
            return
        image.state, image.owned = "absent", False
        self.stats["removed"] += 1
        if self.ledger:
            self.ledger.add(self.exe, image.name, "removed")
        self._measure()

    def _measure(self) -> int | None:
        """Look at the engine's image disk again; what it grew by since the last look (None: the engine did not say)."""
        total = image_disk(self.exe)
        grown = None
        if total is not None and self._base is None:  # the engine did not say at the start: from now on, then
            self._base = total - sum(i.bytes or 0 for i in self._images.values() if i.owned and i.state == "present")
        if total is not None:
            grown, self._grown = max(0, total - self._base - self._grown), total - self._base
        self._recount()
        return grown

    def _recount(self) -> None:
        """The disk the batch's images take: what the engine's images grew by since the batch began, or the sum of
        what each of its images added when pulled, whichever is more. The growth sees layers the batch's images
        share, and other users' images added meanwhile; the sum, what other users removed meanwhile (on a shared
        engine, their removals must not make room for the batch's pulls)."""
        own = sum(i.bytes or 0 for i in self._images.values() if i.owned and i.state == "present")
        self.disk = max(0, self._grown, own)
        self.peak = max(self.peak, self.disk)

    def _start(self, image: _Image) -> None:
        image.state = "pulling"
        self._pulls += 1
        owned = not image.there_before
        if self.ledger:
            self.ledger.add(self.exe, image.name, "pulling", owned=owned)
        thread = threading.Thread(target=self._pull, args=(image, owned), name="miniswe-pull", daemon=True)
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    def _pull(self, image: _Image, owned: bool) -> None:
        def notice(line: str) -> None:
            with self._cond:
                self.stats["rate_limited"] += 1
            self.notice(line)

        error: BaseException | None = None
        seconds = 0.0
        try:
            seconds = pull(self.exe, image.name, stop=self._stop, policy=self.policy, notice=notice)
        except BaseException as caught:  # noqa: BLE001 - whatever happens, the image's state must say so
            error = caught
        with self._cond:
            self._pulls -= 1
            if error is None:
                image.state, image.owned = "present", owned
                grown = self._measure()
                if grown is None:  # the engine did not say: the image's whole size, shared layers too, to be safe
                    grown = image_size(self.exe, image.name) or self._estimate(image) or 0
                image.bytes = grown if owned else image.bytes
                self._recount()
                image.used_at = time.monotonic()
                self.stats["pulls"] += 1
                self.stats["bytes_pulled"] += grown
                self.stats["pull_s"] += seconds
                if self.ledger:
                    self.ledger.add(self.exe, image.name, "pulled", owned=owned, bytes=grown, seconds=round(seconds, 3))
            elif isinstance(error, Cancelled):
                image.state = "absent"
            else:
                image.state = "failed"
                image.error = str(error) if isinstance(error, PullError) else f"cannot pull image {image.name}: {error}"
                self.stats["failed"] += 1
                if getattr(error, "kind", "") == "disk" and not self.fatal:
                    self.fatal = image.error
                    self.notice(f"miniswe: {self.fatal}; no new task starts")
                if self.ledger:
                    self.ledger.add(self.exe, image.name, "failed", detail=image.error)
            self._pump()
            self._cond.notify_all()

    def close(self, tidy: bool) -> dict[str, Any]:
        """Cut pulls under way short; with `tidy` (a budget), remove the batch's images no unfinished task needs.
        What the pool did, for run.json and the report."""
        self._stop.request(self._stop.outcome or _closing(), urgent=True)
        for thread in list(self._threads):
            thread.join(timeout=10)
        with self._cond:
            if tidy:  # a few tries: the last task's container may still be going
                needed = set(self._queue)
                for _ in range(5):
                    left = [i for i in self._images.values() if i.owned and i.state == "present" and not i.users
                            and normal(i.name) not in needed]
                    if not left:
                        break
                    for image in left:
                        if image.remove_after <= time.monotonic():
                            self._remove(image)
                    self._cond.wait(REMOVE_RETRY_S if any(i.state == "present" for i in left) else 0)
            if self._parent_stop is not None:
                self._parent_stop.unlink(self._stop)
            with contextlib.suppress(ValueError):
                _LIVE_POOLS.remove(self)
            return {**self.stats, "pull_s": round(self.stats["pull_s"], 3), "peak_disk": self.peak, "disk": self.disk,
                    "budget": self.policy.budget}


def _closing():
    from miniswe.status import ExitStatus, Outcome

    return Outcome(ExitStatus.INTERRUPTED, "the batch ended")


# -- a batch's pools --------------------------------------------------------------------------------------------
Need = tuple[str, str, str]  # (engine executable, image, pull policy)


def need_of(environment: Any) -> Need | None:
    """What a task's environment needs pulled: its engine, image and pull policy; None for a kind without images."""
    image, exe = getattr(environment, "image", ""), getattr(environment, "executable", "")
    if not image or not exe or getattr(environment, "kind", "docker") == "local":
        return None
    return exe, image, getattr(environment, "pull", "missing")


class BatchImages:
    """The image pools of one batch in one process: one per engine executable, made when first needed."""

    def __init__(self, policy: ImagePolicy, *, ledger_path: str | None = None, stop: Stop | None = None,
                 notice: Callable[[str], None] = lambda line: None):
        self.policy = policy
        self.ledger = ImageLedger(ledger_path) if ledger_path else None
        self.stop = stop
        self.notice = notice
        self._pools: dict[str, ImagePool | None] = {}
        self._lock = threading.Lock()

    def pool(self, exe: str) -> ImagePool | None:
        with self._lock:
            if exe not in self._pools:
                try:
                    self._pools[exe] = ImagePool(exe, self.policy, ledger=self.ledger, stop=self.stop, notice=self.notice)
                except SandboxError as error:  # no engine: each task's environment says so in its own words
                    self.notice(f"miniswe: images are pulled by each task, not ahead: {error}")
                    self._pools[exe] = None
            return self._pools[exe]

    @property
    def fatal(self) -> str | None:
        return next((pool.fatal for pool in list(self._pools.values()) if pool is not None and pool.fatal), None)

    def expect(self, started: Iterable[Need | None], queued: Iterable[Need | None]) -> None:
        """What the tasks handed to a worker need, then what the queued ones need, in the order they will start."""
        by_exe: dict[str, list[tuple[str, str]]] = {}
        counts: dict[str, int] = {}
        for index, needs in enumerate((started, queued)):
            for need in needs:
                if need is not None:
                    by_exe.setdefault(need[0], []).append((need[1], need[2]))
                    counts[need[0]] = counts.get(need[0], 0) + (index == 0)
        for exe in set(by_exe) | {exe for exe, pool in self._pools.items() if pool is not None}:
            pool = self.pool(exe)
            if pool is not None:
                pool.expect(by_exe.get(exe, []), counts.get(exe, 0))

    def ready(self, need: Need | None) -> bool:
        pool = self._pools.get(need[0]) if need is not None else None
        return need is None or pool is None or pool.ready(need[1])

    def acquire(self, need: Need, stop: Stop | None = None, on_wait: Callable[[], None] | None = None) -> dict[str, Any] | None:
        pool = self.pool(need[0])
        return None if pool is None else pool.acquire(need[1], need[2], stop, on_wait)

    def release(self, need: Need) -> None:
        pool = self._pools.get(need[0])
        if pool is not None:
            pool.release(need[1])

    def close(self) -> dict[str, Any] | None:
        """Every pool closed; their numbers together (None when no task needed an image)."""
        return combined([pool.close(tidy=bool(self.policy.budget)) for pool in self._pools.values() if pool is not None])


def combined(summaries: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """Pools' numbers together: counts and times summed, the peak disk the largest (each machine has its own)."""
    summaries = [s for s in summaries if s]
    if not summaries:
        return None
    total = {key: sum(s[key] for s in summaries) for key in ("pulls", "failed", "bytes_pulled", "removed", "rate_limited")}
    return {**total, "pull_s": round(sum(s["pull_s"] for s in summaries), 3),
            "peak_disk": max(s["peak_disk"] for s in summaries), "budget": max(s["budget"] for s in summaries)}


def held_by_batch(exe: str, name: str) -> bool:
    """Whether a batch in this process holds `name` for a task now: DockerEnvironment then pulls it no more (its
    pool pulled it once for the batch, environment.pull: always included)."""
    exe = shutil.which(exe) or exe
    for pool in list(_LIVE_POOLS):
        if pool.exe == exe and pool.holds(name):
            return True
    return False


_LIVE_POOLS: list[ImagePool] = []


# -- ordering a batch for reuse ----------------------------------------------------------------------------------
def reuse_order(items: list, image_of: Callable[[Any], str | None], group_of: Callable[[Any], str | None]) -> list:
    """`items` with those of one group (a repository) together and, within it, those of one image together, each
    where its first one was; otherwise in their order. Each image is then pulled once, and removed once its run of
    tasks is over."""
    groups: dict[Any, dict[Any, list]] = {}
    for index, item in enumerate(items):
        image = image_of(item)
        group = group_of(item) or (image.rsplit(":", 1)[0] if image else None)
        groups.setdefault(group if group is not None else ("", index), {}).setdefault(
            image if image is not None else ("", index), []).append(item)
    return [item for images in groups.values() for members in images.values() for item in members]
