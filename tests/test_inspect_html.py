"""`miniswe inspect --html`: one self-contained page, checked as a file (data embedded once, escaped, no URL) and in
a real headless Chromium: a 500-task batch (one row per task, sorting, filtering, each task's run) and a
5,000-step run (lazy steps, search, hostile output shown inert), with load times measured and screenshots kept.

Screenshots go to $MINISWE_SCREENSHOT_DIR when set (to look at them), else to the test's temporary directory."""

import json
import os
import re
import shutil
import struct
import subprocess

import pytest
from browser import Browser
from conftest import ROOT, clean_env, miniswe_cmd
from inspect_data import HOSTILE, write_run_dir, write_trajectory

from miniswe.inspector.page import embed_json

V2 = str(ROOT / "tests" / "data" / "trajectories" / "v2.json")
REFERENCE = ROOT / "tests" / "data" / "reference"
DATA_ELEMENT = re.compile(r'<script type="application/json" id="miniswe-data">(.*?)</script>', re.S)

# the pages and the browser are made once per module and process: on one xdist worker, once
pytestmark = pytest.mark.xdist_group("inspect-html")


def html(source: str, out: str) -> str:
    result = subprocess.run(miniswe_cmd("inspect", source, "--html", out), capture_output=True, text=True,
                            env=clean_env(), timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == os.path.abspath(out) and "open it in a browser" in result.stderr
    return open(out, encoding="utf-8").read()


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The pages every test here looks at, made once: a 500-task batch, a 5,000-step run, the golden run."""
    root = tmp_path_factory.mktemp("site")
    run_dir, long_run = str(root / "run500"), str(root / "long.traj.json")
    records = write_run_dir(run_dir, 500)
    write_trajectory(long_run, 5000)
    return {
        "root": root, "records": records, "run_dir": run_dir,
        "batch": html(run_dir, str(root / "batch.html")),
        "long": html(long_run, str(root / "long.html")),
        "golden": html(V2, str(root / "golden.html")),
        "reference": html(str(REFERENCE / "mini-swe-agent-1-limits-exceeded.traj.json"), str(root / "reference.html")),
    }


def embedded(page: str) -> dict:
    found = DATA_ELEMENT.findall(page)
    assert len(found) == 1, "the data is embedded exactly once"
    return json.loads(found[0])


# -- the file -------------------------------------------------------------------------------------------------------
def test_hostile_text_cannot_end_the_data_element():
    data = {"output": HOSTILE, "key</script>": "<!-- \u2029 -->"}
    text = embed_json(data)
    assert json.loads(text) == data
    assert not re.search(r"[<>&\u2028\u2029]", text)


def test_the_page_is_self_contained(site):
    for name in ("batch", "long", "golden", "reference"):
        page = site[name]
        assert page.count("<script") == 2 and page.count("</script>") == 2, "the data element and the page's script only"
        outside = DATA_ELEMENT.sub("", page)
        assert not re.search(r"https?://", outside), f"{name}: a URL outside the escaped data"
        assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page, re.I), f"{name}: something to fetch"
        assert "Content-Security-Policy\" content=\"default-src 'none';" in page
    assert '<script src="https://example.invalid/x.js">' not in site["long"]
    assert '\\u003cscript src=\\"https://example.invalid/x.js\\"\\u003e' in site["long"], "the hostile output is data, escaped"


def test_the_batch_page_embeds_each_task_once(site):
    data = embedded(site["batch"])
    ids = [row["id"] for row in data["batch"]["rows"]]
    assert sorted(ids) == sorted(r.id for r in site["records"]) and len(set(ids)) == 500
    assert sorted(data["runs"]) == sorted(ids)
    run = data["runs"]["task-0003"]
    assert len(run["steps"]) == 11 and run["header"]["task"] == "Task 3: fix it"
    assert len(site["batch"]) < 6_000_000, "500 tasks of 8 to 12 steps stay a few MB"


def test_a_stored_output_is_embedded_only_where_the_model_saw_less(site):
    data = embedded(site["golden"])
    fields = data["step_fields"]
    steps = [dict(zip(fields, row)) for row in data["run"]["steps"]]
    assert steps[0]["output"] is None and steps[0]["observation"].endswith("notes.txt\nhello\n</output>")
    assert steps[4]["elided_chars"] == 104894 and steps[4]["output"] is None, "the model saw all that was kept"
    assert data["run"]["header"]["submission"] == "diff --git a/x b/x\n+fixed\n"


def test_a_task_whose_trajectory_is_gone_still_has_its_row(tmp_path):
    run_dir = str(tmp_path / "run")
    write_run_dir(run_dir, 3)
    os.remove(os.path.join(run_dir, "task-0001", "task-0001.traj.json"))
    data = embedded(html(run_dir, str(tmp_path / "b.html")))
    assert len(data["batch"]["rows"]) == 3
    assert "task-0001/task-0001.traj.json" in data["runs"]["task-0001"]["error"]


def test_a_ledger_cannot_point_the_page_outside_its_run_directory(tmp_path):
    run_dir = tmp_path / "run"
    write_run_dir(str(run_dir), 2)
    write_trajectory(str(tmp_path / "elsewhere.traj.json"), 3, task="not this batch's")
    ledger = run_dir / "results.jsonl"
    lines = [json.loads(line) for line in ledger.read_text().splitlines()]
    lines[0]["trajectory"] = "../elsewhere.traj.json"
    lines[1]["trajectory"] = str(tmp_path / "elsewhere.traj.json")
    ledger.write_text("".join(json.dumps(line) + "\n" for line in lines))
    page = html(str(run_dir), str(tmp_path / "b.html"))
    assert "not this batch" not in page
    assert all("no trajectory inside the run directory" in run["error"] for run in embedded(page)["runs"].values())


def test_html_refuses_a_directory_and_comparisons(tmp_path):
    result = subprocess.run(miniswe_cmd("inspect", V2, "--html", str(tmp_path)), capture_output=True, text=True, env=clean_env())
    assert result.returncode == 2 and "is a directory" in result.stderr
    result = subprocess.run(miniswe_cmd("inspect", V2, V2, "--html", "x.html"), capture_output=True, text=True, env=clean_env())
    assert result.returncode == 2 and "--html does not apply to a comparison" in result.stderr


def test_html_into_a_new_folder_makes_it(tmp_path):
    out = tmp_path / "pages" / "new" / "run.html"
    assert "<!doctype html>" in html(V2, str(out))
    (tmp_path / "file").write_text("")
    result = subprocess.run(miniswe_cmd("inspect", V2, "--html", str(tmp_path / "file" / "run.html")), capture_output=True,
                            text=True, env=clean_env())
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "cannot create its folder" in result.stderr


def history_run(path: str) -> None:
    """A run that was resumed once, forked from another, changed one command, and was killed during step 3."""
    from miniswe.trajectory import Step, Trajectory

    trajectory = Trajectory(path, task="fix it", config={}, environment={})
    trajectory.parent = {"trajectory": "/runs/parent.traj.json", "run_id": "r-1", "from_step": 1}
    trajectory.record_step(Step(1, command="ls", returncode=0, output="a\n"))
    trajectory.resumes.append({"at": "2026-01-01T00:00:00.000Z", "from_step": 1, "changes": {"agent.step_limit": [5, 9]}})
    trajectory.record_step(Step(2, command="rm -i build.log", proposed="rm -rf build", returncode=0, output=""))
    trajectory.set_pending(Step(3, command="make test"))
    trajectory.save()


def test_the_page_shows_a_runs_history_and_changed_and_unfinished_commands(tmp_path, browser):
    source = str(tmp_path / "h.traj.json")
    history_run(source)
    data = embedded(html(source, str(tmp_path / "h.html")))
    header = data["run"]["header"]
    assert header["pending"] == 3 and header["parent"]["from_step"] == 1 and header["resumes"][0]["from_step"] == 1
    browser.open((tmp_path / "h.html").as_uri())
    facts = browser.eval("document.querySelector('dl.facts').textContent")
    assert "forked" in facts and "/runs/parent.traj.json at step 1" in facts
    assert "after step 1 · changed agent.step_limit" in facts and "step 3: its command never finished" in facts
    badges = browser.eval("Array.from(document.querySelectorAll('details.step summary')).map(s => s.querySelector('span:nth-child(2)').textContent)")
    assert badges == ["rc=0", "rc=0command changed", "cut short / never finished"]
    browser.eval("document.querySelectorAll('details.step').forEach(d => d.open = true)")
    assert browser.eval("document.querySelector('#step-2 pre.proposed').textContent") == "$ rm -rf build"
    assert "never finished" in browser.eval("document.querySelector('#step-3 .body').textContent")


# -- in a browser ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def browser():
    with Browser(width=1280, height=900) as chromium:
        chromium.call("Network.enable", session=True)
        yield chromium


def shot(browser, name: str, tmp_dir) -> str:
    """A screenshot kept for a person to look at; checked to be a real, non-blank page-sized image."""
    path = os.path.join(str(tmp_dir), name)
    data = browser.screenshot(path)
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", data[16:24]) == (1280, 900)
    assert len(data) > 20_000, f"{name} looks blank ({len(data)} bytes)"
    keep = os.environ.get("MINISWE_SCREENSHOT_DIR")
    if keep:
        os.makedirs(keep, exist_ok=True)
        shutil.copy(path, os.path.join(keep, name))
    return path


def network(browser) -> list[str]:
    return [e["params"]["request"]["url"] for e in browser.events if e.get("method") == "Network.requestWillBeSent"]


def rendered_ms(browser) -> int:
    return int(browser.eval("document.getElementById('app').getAttribute('data-rendered-ms')"))


def test_500_tasks_in_a_browser(site, browser, tmp_path):
    url = (site["root"] / "batch.html").as_uri()
    browser.open(url)
    load = rendered_ms(browser)
    print(f"\n500-task batch page ({len(site['batch']) / 1e6:.1f} MB): rendered {load} ms after navigation")
    assert browser.eval("document.querySelectorAll('table.tasks tbody tr').length") == 500
    ids = browser.eval("Array.from(document.querySelectorAll('table.tasks tbody tr')).map(r => r.dataset.id)")
    assert ids == sorted(r.id for r in site["records"]), "one row per task, sorted by id"
    assert "500 tasks" in browser.eval("document.getElementById('row-count').textContent")
    shot(browser, "batch-500.png", tmp_path)
    assert network(browser) == [url], "the page loads nothing but itself"
    assert load < 15_000, "generous bound: the machine is shared; measured ~0.2-0.5 s"

    # sort by cost (largest first), then filter by status through the select
    browser.eval("Array.from(document.querySelectorAll('table.tasks th button')).find(b => b.textContent === 'cost').click()")
    costs = browser.eval("Array.from(document.querySelectorAll('table.tasks tbody tr td:nth-child(6)')).map(td => td.textContent)")
    assert costs[0] == f"${max(r.cost for r in site['records']):.4f}" and len(costs) == 500
    browser.set_value('select[aria-label="exit status"]', "ModelError", "change")
    shown = browser.eval("Array.from(document.querySelectorAll('table.tasks tbody tr')).map(r => r.dataset.id)")
    assert sorted(shown) == sorted(r.id for r in site["records"] if r.exit_status == "ModelError") and len(shown) == 50
    shot(browser, "batch-500-model-errors.png", tmp_path)

    # a row leads to that task's run; back leads to the table
    browser.eval("document.querySelector('table.tasks tbody tr td:nth-child(3)').click()")
    first = shown[0]
    browser.wait_for(f"location.hash === '#task={first}' && document.querySelector('h1').textContent.startsWith('{first}')")
    steps = next(r.steps for r in site["records"] if r.id == first)
    assert browser.eval("document.querySelectorAll('details.step').length") == steps
    shot(browser, "batch-500-task.png", tmp_path)
    browser.eval("history.back()")
    browser.wait_for("document.querySelectorAll('table.tasks tbody tr').length === 50")


def test_5000_steps_in_a_browser(site, browser, tmp_path):
    url = (site["root"] / "long.html").as_uri()
    browser.events.clear()
    browser.open(url)
    load = rendered_ms(browser)
    print(f"\n5,000-step run page ({len(site['long']) / 1e6:.1f} MB): rendered {load} ms after navigation")
    assert browser.eval("document.querySelectorAll('details.step').length") == 5000
    assert browser.eval("document.querySelectorAll('.step .body').length") == 0, "step bodies are built when opened"
    assert load < 20_000, "generous bound: the machine is shared; measured ~0.5-1.6 s"
    shot(browser, "run-5000.png", tmp_path)

    # the hostile output, opened: shown as text, nothing run, nothing loaded
    browser.open(url + "#step=23")
    browser.wait_for("document.querySelector('#step-23 pre.observation') !== null")
    observation = browser.eval("document.querySelector('#step-23 pre.observation').textContent")
    assert HOSTILE in observation
    assert browser.eval("window.__pwned === undefined && document.scripts.length === 2 && document.images.length === 0")
    shot(browser, "run-5000-hostile-step.png", tmp_path)
    assert set(network(browser)) <= {url, url + "#step=23"}

    # search covers steps never opened; errors only keeps format errors, timeouts, aborts and non-zero exits
    browser.set_value("input[type=search]", "PART_4999")
    browser.wait_for("document.querySelectorAll('details.step:not(.hidden)').length === 1")
    assert browser.eval("document.querySelector('details.step:not(.hidden)').id") == "step-4999"
    browser.set_value("input[type=search]", "")
    browser.wait_for("document.querySelectorAll('details.step:not(.hidden)').length === 5000")
    browser.eval("document.getElementById('errors-only').click()")
    assert browser.eval("document.querySelectorAll('details.step:not(.hidden)').length") == 400
    browser.eval("Array.from(document.querySelectorAll('button')).find(b => b.textContent === 'Expand all').click()")
    assert browser.eval("document.querySelectorAll('details.step[open]:not(.hidden) .body').length") == 300, "expand all opens at most 300"
    shot(browser, "run-5000-errors.png", tmp_path)


def test_golden_and_reference_runs_in_a_browser(site, browser, tmp_path):
    browser.open((site["root"] / "golden.html").as_uri())
    badges = browser.eval("Array.from(document.querySelectorAll('details.step summary')).map(s => s.querySelector('span:nth-child(2)').textContent)")
    assert badges == ["rc=0", "format error (no_action)", "rc=1", "timed out", "rc=0104,894 bytes not kept", "rc=0", "rc=0"]
    assert browser.eval("document.querySelector('pre.submission').textContent") == "diff --git a/x b/x\n+fixed\n"
    browser.eval("document.querySelectorAll('details.step').forEach(d => d.open = true)")
    assert browser.eval("document.querySelector('#step-6 pre.observation').textContent").count("</script><script>alert(1)</script>") == 1
    shot(browser, "golden.png", tmp_path)
    browser.open((site["root"] / "reference.html").as_uri())
    assert browser.eval("document.querySelectorAll('details.step').length") == 100
    facts = browser.eval("document.querySelector('dl.facts').textContent")
    assert "not recorded" in facts and "how long each command ran" in facts and "mini-swe-agent-1" in facts
    shot(browser, "reference.png", tmp_path)
