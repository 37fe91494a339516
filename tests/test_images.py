"""Images of a batch against a real registry on loopback (tests/registry.py): pulls retried with one shared backoff,
a pull that fails as its own outcome, pulls ahead of the tasks, the disk budget with LRU removal of the batch's own
images only, the order for reuse, the time split, `miniswe images`, and a kill -9 mid-pull then a rerun."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import yaml
from conftest import act, clean_env
from openai_server import ScriptedServer

import registry as reg
from miniswe.batch.run import BatchOptions, run_batch
from miniswe.config import load_config
from miniswe.environments import images
from miniswe.errors import Cancelled, PullError, UsageError
from miniswe.signals import Stop

REGISTRY = [pytest.mark.docker, pytest.mark.xdist_group("registry")]  # one registry per worker; proxies apart
FAST = images.PullPolicy(tries=4, backoff_s=0.2, max_backoff_s=2.0, timeout_s=120)


# -- without an engine ------------------------------------------------------------------------------------------
def test_sizes_names_and_what_a_pull_error_says():
    assert images.parse_size("50G") == 50 * 10**9 and images.parse_size("500MB") == 5 * 10**8
    assert images.parse_size("2GiB") == 2 * 2**30 and images.parse_size("1.5t") == 1.5e12 and images.parse_size(123) == 123
    with pytest.raises(UsageError, match=r"--image-budget '50X': not a size; write e\.g\. 50G"):
        images.parse_size("50X")
    assert images.normal("python") == "python:latest" and images.normal("docker.io/library/python:3.11") == "python:3.11"
    assert images.normal("127.0.0.1:5000/a/b") == "127.0.0.1:5000/a/b:latest"
    assert images.registry_of("python:3.11") == "docker.io" and images.registry_of("ghcr.io/a/b:1") == "ghcr.io"
    assert images.registry_of("127.0.0.1:5000/x") == "127.0.0.1:5000" and images.registry_of("swebench/sweb.eval:1") == "docker.io"
    said = "1: Pulling from x\nabc: Pulling fs layer\nError response from daemon: toomanyrequests: You have reached your pull rate limit.\n"
    assert images.classify(said) == "rate_limit" and images.pull_problem(said) == "toomanyrequests: You have reached your pull rate limit."
    assert images.classify("error pulling image configuration: download failed after attempts=1: toomanyrequests: x") == "rate_limit"
    assert images.classify("write /var/lib/docker/tmp/x: no space left on device") == "disk"
    assert images.classify("manifest for x:1 not found: manifest unknown: manifest unknown") == "permanent"
    assert images.classify('Get "https://registry-1.docker.io/v2/": dial tcp: lookup registry-1.docker.io: no such host') == "permanent"
    assert images.classify("received unexpected HTTP status: 500 Internal Server Error") == "transient"
    assert images.classify('dial tcp 127.0.0.1:5000: connect: connection refused') == "transient"


def test_tasks_sharing_an_image_or_a_repository_run_together_in_first_seen_order():
    tasks = [("a1", "A", "r1"), ("b1", "B", "r2"), ("c1", None, None), ("a2", "A", "r1"), ("d1", "D", "r1"),
             ("b2", "B", "r2"), ("c2", None, None), ("a3", "A", "r1")]
    ordered = images.reuse_order(tasks, lambda t: t[1], lambda t: t[2])
    assert [t[0] for t in ordered] == ["a1", "a2", "a3", "d1", "b1", "b2", "c1", "c2"]
    # without repositories: by image name, its tags together
    tasks = [("x", "img:1", None), ("y", "other:1", None), ("z", "img:2", None), ("w", "img:1", None)]
    assert [t[0] for t in images.reuse_order(tasks, lambda t: t[1], lambda t: None)] == ["x", "w", "z", "y"]


def test_bad_image_options_are_bad_input(tmp_path):
    config = load_config({})
    for options, message in (({"image_budget": "lots"}, "--image-budget 'lots': not a size"),
                             ({"max_pulls": 0}, "--max-pulls 0: must be 1 or more"),
                             ({"prefetch": -1}, "--prefetch -1: must be 0")):
        with pytest.raises(UsageError, match=message):
            run_batch(config, BatchOptions(str(tmp_path / "missing.yaml"), str(tmp_path / "run"), **options))


# -- a real registry --------------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def registry():
    problem = reg.problem()
    if problem and (os.environ.get("MINISWE_REQUIRE_DOCKER") or os.environ.get("MINISWE_REQUIRE_REGISTRY")):
        raise RuntimeError(f"the registry tests must run here, but cannot: {problem}")
    if problem:
        pytest.skip(f"no loopback registry: {problem}")
    server = reg.Registry(reg.seeded_data())
    yield server
    server.close()


@pytest.fixture
def proxy(registry):
    front = reg.Proxy(registry.port)
    yield front
    front.close()


def wait_until(predicate, timeout=30.0, what="the condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.mark.docker
@pytest.mark.xdist_group("registry")
def test_a_failed_pull_is_retried_and_a_rate_limit_pauses_every_pull_from_the_registry(proxy):
    proxy.fail = 2  # two 500s, then the real manifest
    seconds = images.pull("docker", proxy.image("img0"), policy=FAST)
    manifests = [(e["method"], e["status"]) for e in proxy.log if "/manifests/" in e["path"]]
    assert [m for m in manifests if m[0] == "GET" and m[1] == 500] == [("GET", 500)] * 2 and manifests[-1][1] == 200
    assert seconds > 0 and proxy.present() == [proxy.image("img0")]

    proxy.rate_limit, proxy.retry_after = 1, 1
    policy = images.PullPolicy(tries=4, backoff_s=1.5, max_backoff_s=3.0)
    notices: list[str] = []
    first = threading.Thread(target=images.pull, args=("docker", proxy.image("img1")),
                             kwargs={"policy": policy, "notice": notices.append})
    gate = images.gate_for(proxy.image("img1"))
    first.start()
    wait_until(lambda: gate.paused_for() > 0, what="the 429's pause")
    resume_at = time.monotonic() + gate.paused_for()
    assert gate.paused_for() > 1.0, "the first backoff: 1.5 s, jittered by 10%"
    # another pull from the same registry, begun during the pause, waits it out before asking anything
    second = threading.Thread(target=images.pull, args=("docker", proxy.image("img2")), kwargs={"policy": policy})
    asked = time.monotonic()
    second.start()
    first.join(30), second.join(30)
    later = [e["at"] for e in proxy.log if e["at"] > asked and e["method"] == "GET" and e["path"] != "/v2/"]
    assert later and min(later) >= resume_at - 0.05, "a request came during the pause"
    assert notices and "127.0.0.1" in notices[0] and "rate-limits pulls (toomanyrequests" in notices[0]
    assert sorted(proxy.present()) == sorted(proxy.image(t) for t in ("img0", "img1", "img2"))


@pytest.mark.docker
@pytest.mark.xdist_group("registry")
def test_a_pull_that_cannot_succeed_fails_at_once_and_used_up_retries_name_themselves(proxy):
    started = time.monotonic()
    with pytest.raises(PullError) as caught:
        images.pull("docker", proxy.image("no-such-tag"), policy=FAST)
    assert caught.value.kind == "permanent" and time.monotonic() - started < 5
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"cannot pull image {proxy.image('no-such-tag')}: manifest for")
    assert "manifest unknown" in message and "set environment.pull: never" in message
    assert len(proxy.requests("/manifests/")) == 1, "not retried"

    proxy.fail = 99
    with pytest.raises(PullError, match=r"received unexpected HTTP status: 500 .*\(gave up after 2 tries\); check the "
                                         r"registry and the network, then rerun"):
        images.pull("docker", proxy.image("img0"), policy=images.PullPolicy(tries=2, backoff_s=0.1))
    stop = Stop()
    threading.Timer(0.3, lambda: stop.request(images._closing())).start()
    with pytest.raises(Cancelled):  # a stop ends the backoff's wait
        images.pull("docker", proxy.image("img0"), stop=stop, policy=images.PullPolicy(tries=3, backoff_s=30))


# -- batches ----------------------------------------------------------------------------------------------------
STEP = act('n=$(( $(cat /tmp/.n 2>/dev/null || echo 0) + 1 )); echo $n > /tmp/.n; sleep "${SLEEP:-0}"; '
           'if [ "$n" -ge 2 ]; then echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; echo "done in $(ls /pad-*)"; fi')


def write_tasks(path, proxy, tags, sleep=0.0, ids=None):
    tasks = [{"id": (ids or {}).get(i, f"t{i}-{tag}"), "task": "count to 2",
              "env": {"image": proxy.image(tag), "env": {"SLEEP": str(sleep)}}} for i, tag in enumerate(tags)]
    path.write_text(yaml.safe_dump(tasks, sort_keys=False))
    return path


def batch(server, tasks, run_dir, **options):
    config = load_config({"model": {"base_url": server.base_url, "name": "test-model", "retries": 1, "max_backoff": 0.01},
                          "agent": {"step_limit": 10}, "environment": {"timeout": 30}})
    stream = io.StringIO()
    options = {"pull_backoff": 0.2, **options}
    result = run_batch(config, BatchOptions(str(tasks), str(run_dir), **options), stream=stream)
    result.log = stream.getvalue()
    return result


def records(run_dir):
    return {r["id"]: r for r in map(json.loads, (run_dir / "results.jsonl").read_text().splitlines())}


@pytest.fixture
def model():
    with ScriptedServer(default=STEP, latency=0.01) as server:
        yield server


@pytest.mark.docker
@pytest.mark.xdist_group("registry")
def test_images_are_pulled_ahead_while_tasks_run_and_each_task_records_its_wait(tmp_path, proxy, model):
    proxy.blob_delay = 1.0  # a slow link: each pull takes over a second
    tags = ["img0", "img1", "img2", "img3"]
    tasks = write_tasks(tmp_path / "tasks.yaml", proxy, tags, sleep=0.8)
    result = batch(model, tasks, tmp_path / "run", workers=1, prefetch=2)
    assert result.exit_code == 0, result.log
    found = records(tmp_path / "run")
    assert {r["exit_status"] for r in found.values()} == {"Submitted"}
    waits = {r["id"]: r["image"] for r in found.values()}
    assert waits["t0-img0"]["wait"] == "pull" and waits["t0-img0"]["wait_s"] >= 0.9
    # the others' pulls went on while the task before them ran: they started at once
    assert [waits[f"t{i}-{tag}"]["wait"] for i, tag in enumerate(tags)][1:] == ["none", "none", "none"]
    assert all(w["name"] == proxy.image(t) for w, t in zip(waits.values(), tags))
    assert len([e for e in proxy.requests("/blobs/") if e["status"] == 200]) == 2 * len(tags), "each pulled once"
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    pulled = run["invocations"][-1]["images"]
    assert pulled["pulls"] == 4 and pulled["failed"] == 0 and pulled["pull_s"] >= 4 * 1.0
    assert 4 * 2_900_000 <= pulled["bytes_pulled"] <= 4 * 3_300_000, pulled
    # against what the registry served (random layers: the download is about their size on disk)
    served = sum(e["bytes"] for e in proxy.requests("/blobs/") if e["status"] == 200)
    assert abs(pulled["bytes_pulled"] - served) <= 0.05 * served, (pulled["bytes_pulled"], served)
    slowest = [e["done"] - e["at"] for e in proxy.requests("/blobs/")]
    assert min(slowest) >= 1.0 and pulled["pull_s"] >= 4 * min(slowest)  # the report's pull time is the link's
    report = result.report
    assert report["time"]["image_waits"] == {"none": 3, "pull": 1} and report["time"]["pull_wait_s"] >= 0.9
    assert report["time"]["model_s"] > 0 and report["images"]["pulls"] == 4
    markdown = (tmp_path / "run" / "report.md").read_text()
    assert "## Where the time went" in markdown and "| waiting for image pulls |" in markdown
    assert "Tasks by image wait: 3 started at once, 1 waited for a pull." in markdown
    assert "Images: 4 pulled (" in markdown and "(no budget)" in markdown
    assert sorted(proxy.present()) == sorted(proxy.image(t) for t in tags), "no budget: the images stay"
    ledger = [json.loads(line) for line in (tmp_path / "run" / "images.jsonl").read_text().splitlines()]
    assert [e["event"] for e in ledger].count("pulled") == 4 and all(e["owned"] for e in ledger if e["event"] == "pulling")


class Sampler:
    """The engine's image list and `docker system df`, sampled while a batch runs."""

    def __init__(self, proxy):
        self.proxy, self.samples, self.others, self.times = proxy, [], set(), []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self.done.is_set():
            listed = subprocess.run(["docker", "images", "--format", "{{.Repository}}:{{.Tag}}"], capture_output=True, text=True)
            names = set(listed.stdout.split())
            ours = {n for n in names if n.startswith(f"127.0.0.1:{self.proxy.port}/")}
            self.others.add(frozenset(names - ours))
            self.samples.append((ours, images.image_disk("docker")))
            self.times.append(time.time())
            time.sleep(0.1)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join(10)


@pytest.mark.docker
@pytest.mark.xdist_group("registry")
def test_a_batch_over_more_images_than_its_budget_holds_removes_only_its_own_unneeded_images(tmp_path, proxy, model):
    before = proxy.image("img5")
    images.pull("docker", before)  # there before the batch: never removed, and outside the budget
    tags = ["img0", "img1", "img2", "img3", "img4", "img5", "img0"]  # img0 twice: kept for its second task
    tasks = write_tasks(tmp_path / "tasks.yaml", proxy, tags, sleep=0.5)
    base = images.image_disk("docker")
    budget = 7_500_000  # two of the 3 MB images
    with Sampler(proxy) as sampler:
        result = batch(model, tasks, tmp_path / "run", workers=3, image_budget=str(budget), prefetch=2)
    assert result.exit_code == 0, result.log
    found = records(tmp_path / "run")
    assert {r["exit_status"] for r in found.values()} == {"Submitted"} and len(found) == 7
    # reuse order: the second img0 task ran right after the first (or beside it), so img0 was pulled once
    pulled = [e["image"] for e in map(json.loads, (tmp_path / "run" / "images.jsonl").read_text().splitlines())
              if e["event"] == "pulled"]
    assert sorted(pulled) == sorted(proxy.image(t) for t in ("img0", "img1", "img2", "img3", "img4")), pulled
    # never more than two of the batch's own images at once, beside the one there before
    most = max(len(ours - {before}) for ours, _ in sampler.samples)
    ledger = (tmp_path / "run" / "images.jsonl").read_text()
    assert most <= 2, ([(t, sorted(o)) for t, (o, _) in zip(sampler.times, sampler.samples) if len(o - {before}) > 2][:3],
                       ledger, result.log)
    assert all(before in ours for ours, _ in sampler.samples), "the image there before the batch was removed"
    if len(sampler.others) == 1:  # nobody else changed the engine's images meanwhile: the disk itself is compared
        peak = max(disk for _, disk in sampler.samples if disk is not None)
        assert peak - base <= budget + 200_000, (peak - base, budget)
    summary = json.loads((tmp_path / "run" / "run.json").read_text())["invocations"][-1]["images"]
    assert summary["peak_disk"] <= budget and summary["budget"] == budget and summary["removed"] == 5
    waits = [r["image"]["wait"] for r in found.values()]
    assert "budget" in waits, waits  # three workers, room for two images: someone queued behind the budget
    assert proxy.present() == [before], "the batch's images are gone at its end, the one there before stays"
    assert "queued behind the image budget" in result.markdown and "peak image disk" in result.markdown

    # the time split on the page, as a person sees it
    from browser import Browser
    from miniswe.inspector import InspectOptions, inspect_paths

    page = tmp_path / "run.html"
    inspect_paths([str(tmp_path / "run")], InspectOptions(html=str(page)))
    with Browser() as chromium:
        chromium.open(page.as_uri())
        chromium.wait_for("document.getElementById('app').getAttribute('data-rendered-ms')")
        text = chromium.eval("document.body.innerText")
    for label in ("agent time (commands and the rest)", "model time", "waiting for image pulls",
                  "queued behind the image budget", "5 image(s) pulled in", "peak image disk (budget 7.5 MB)"):
        assert label in text, label


@pytest.mark.docker
@pytest.mark.xdist_group("registry")
def test_a_pull_that_finally_fails_is_its_own_outcome_and_a_rerun_pulls_again(tmp_path, proxy, model):
    tasks = write_tasks(tmp_path / "tasks.yaml", proxy, ["img0", "img1"])
    proxy.rate_limit = 99
    first = batch(model, tasks, tmp_path / "run", workers=2, pull_tries=2)
    assert first.exit_code == 3
    found = records(tmp_path / "run")
    assert {r["exit_status"] for r in found.values()} == {"PullError"}
    detail = found["t0-img0"]["exit_detail"]
    assert "toomanyrequests" in detail and "gave up after 2 tries" in detail and "rate limit" in detail and "\n" not in detail
    assert found["t0-img0"]["steps"] == 0 and found["t0-img0"]["image"]["wait"] == "failed"
    assert not model.requests, "the agent never ran"
    assert "rate-limits pulls" in first.log
    assert {f["exit_status"] for f in first.report["infra_failures"]} == {"PullError"}
    assert "| PullError | infrastructure | 2 |" in first.markdown and "Rerun only the 2 failed tasks" in first.markdown

    proxy.rate_limit = 0
    again = batch(model, tasks, tmp_path / "run", workers=2)
    assert again.exit_code == 0 and again.ran == 2
    assert {r["exit_status"] for r in records(tmp_path / "run").values()} == {"Submitted"}


@pytest.mark.docker
@pytest.mark.xdist_group("registry")
def test_images_prepulls_what_a_task_list_needs(tmp_path, proxy):
    from miniswe.batch.prepull import prepull

    tasks = write_tasks(tmp_path / "tasks.yaml", proxy, ["img0", "img1", "img0"], ids={2: "again"})
    config = load_config({})
    out = io.StringIO()
    assert prepull(str(tasks), config, stream=out, policy=FAST) == 0
    text = out.getvalue()
    assert text.count("miniswe images: pulled   ") == 2 and "2 image(s): 2 pulled, 0 already present, 0 failed" in text
    again = subprocess.run([sys.executable, "-m", "miniswe", "images", str(tasks)], capture_output=True, text=True,
                           timeout=300)  # as a user types it
    assert again.returncode == 0, again.stderr
    assert "2 image(s): 0 pulled, 2 already present, 0 failed" in again.stdout + again.stderr
    write_tasks(tasks, proxy, ["no-such-tag"])
    out = io.StringIO()
    assert prepull(str(tasks), config, stream=out, policy=FAST) == 3
    assert "miniswe images: failed   cannot pull image" in out.getvalue()


KILLED_BATCH = """
import sys
from miniswe.batch.run import BatchOptions, run_batch
from miniswe.config import load_config
config = load_config({"model": {"base_url": sys.argv[1], "name": "test-model"}, "environment": {"timeout": 30}})
run_batch(config, BatchOptions(sys.argv[2], sys.argv[3], workers=1, image_budget="7.5M", prefetch=1))
"""


@pytest.mark.docker
@pytest.mark.xdist_group("registry")
def test_kill_9_mid_pull_leaves_no_half_state_and_a_rerun_finishes_and_tidies(tmp_path, proxy, model):
    tasks = write_tasks(tmp_path / "tasks.yaml", proxy, ["img0", "img1", "img2"])
    run = tmp_path / "run"
    proxy.blob_delay = 4.0
    proc = subprocess.Popen([sys.executable, "-c", KILLED_BATCH, model.base_url, str(tasks), str(run)],
                            env=clean_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: proxy.requests("/blobs/"), timeout=60, what="a pull under way")
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(30)
    assert not (run / "results.jsonl").exists() or not (run / "results.jsonl").read_text().strip()
    ledger = [json.loads(line) for line in (run / "images.jsonl").read_text().splitlines()]
    assert ledger[0]["event"] == "pulling" and ledger[0]["owned"] is True
    dangling = subprocess.run(["docker", "images", "--filter", "dangling=true", "--format", "{{.ID}}"],
                              capture_output=True, text=True).stdout.split()
    proxy.blob_delay = 0.0
    again = batch(model, tasks, run, workers=1, image_budget="7.5M", prefetch=1)
    assert again.exit_code == 0 and again.ran == 3, again.log
    assert {r["exit_status"] for r in records(run).values()} == {"Submitted"}
    # the image the killed batch began to pull (the orphaned client may have finished it) was the batch's: removed
    assert proxy.present() == [], proxy.present()
    after = subprocess.run(["docker", "images", "--filter", "dangling=true", "--format", "{{.ID}}"],
                           capture_output=True, text=True).stdout.split()
    assert not set(after) - set(dangling), "a half-pulled image was left behind"


@pytest.mark.docker
@pytest.mark.xdist_group("registry")
def test_a_full_disk_is_reported_as_such_before_any_pull_and_no_new_task_starts(tmp_path, proxy, model, monkeypatch):
    monkeypatch.setattr(images, "_free_bytes", lambda root: 300_000_000)  # under the 1 GB a pull must leave free
    tasks = write_tasks(tmp_path / "tasks.yaml", proxy, ["img0", "img1", "img2"])
    result = batch(model, tasks, tmp_path / "run", workers=1)
    assert result.exit_code == 3 and result.not_started == ["t1-img1", "t2-img2"]
    found = records(tmp_path / "run")
    assert list(found) == ["t0-img0"] and found["t0-img0"]["exit_status"] == "PullError"
    detail = found["t0-img0"]["exit_detail"]
    assert detail.startswith("the docker engine's disk is full: 300.0 MB free in ") and "about 1.0 GB needed to pull" in detail
    assert "free space (`docker image prune`) or set a smaller --image-budget, then rerun" in detail
    assert "miniswe: the docker engine's disk is full" in result.log and "no new task starts" in result.log
    assert "2 task(s) not run (the docker engine's disk is full" in result.markdown
    assert not proxy.requests("/blobs/") and not (tmp_path / "run" / "images.jsonl").exists(), "nothing was pulled"
    assert not model.requests

    monkeypatch.undo()  # room again: the rerun runs them all
    again = batch(model, tasks, tmp_path / "run", workers=1)
    assert again.exit_code == 0 and again.ran == 3
