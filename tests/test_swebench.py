"""SWE-bench: task lists by name or file, the shipped benchmark config, and grading by the official harness.

The grading tests are real and offline: they build a small instance image from the local test image (a Python
repository at /testbed with a real bug, pytest in a conda-like `testbed` env, a stand-in for conda's activate
script), run the agent on it with scripted models that submit a right and a wrong fix, grade in the run, and
then grade the same preds.json with the official harness (`python -m swebench.harness.run_evaluation`) against
the same image: both must resolve the same instances.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, clean_env, missing
from miniswe.batch.run import BatchOptions, run_batch
from miniswe.batch.tasks import load_task_list
from miniswe.config import load_config
from miniswe.errors import UsageError

BASE_IMAGE = "miniswe-test:latest"
INSTANCE_ID = "miniswe__textkit-1"
NO_SWEBENCH = missing("swebench", "MINISWE_REQUIRE_SWEBENCH")
NO_DATASETS = missing("datasets", "MINISWE_REQUIRE_SWEBENCH")


def instance_row(instance_id: str = "org__repo-1", **extra) -> dict:
    return {"instance_id": instance_id, "repo": "org/repo", "base_commit": "abc", "version": "1.0",
            "problem_statement": f"Bug in {instance_id}", "patch": "", "test_patch": "",
            "FAIL_TO_PASS": '["t::a"]', "PASS_TO_PASS": "[]", **extra}


# -- task lists --------------------------------------------------------------------------------------------------
def test_dataset_names_aliases_and_files_are_told_apart(tmp_path):
    from miniswe.swebench.datasets import dataset_name

    (tmp_path / "lite.jsonl").write_text("")
    assert dataset_name("verified") == "SWE-bench/SWE-bench_Verified"
    assert dataset_name("Lite") == "SWE-bench/SWE-bench_Lite"
    assert dataset_name("full") == "SWE-bench/SWE-bench" and dataset_name("multimodal").endswith("_Multimodal")
    assert dataset_name("multilingual").endswith("_Multilingual")
    assert dataset_name("someone/their-bench") == "someone/their-bench"
    assert dataset_name(str(tmp_path / "lite.jsonl")) is None  # an existing file is a file
    assert dataset_name("missing/tasks.jsonl") is None  # a file name, even where it does not exist
    assert dataset_name(str(tmp_path)) == str(tmp_path)  # a folder is a dataset folder


def test_an_instance_without_an_image_gets_the_harness_name_and_the_benchmark_config_fills_it(tmp_path):
    from miniswe.batch.plan import plan_tasks
    from miniswe.swebench.datasets import with_benchmark
    from miniswe.batch.evaluate import batch_sources as benchmark_sources

    path = tmp_path / "lite.jsonl"
    path.write_text(json.dumps(instance_row("django__django-11099")) + "\n"
                    + json.dumps(instance_row("a__b-2", image="registry.example/own:tag")) + "\n")
    task_file = load_task_list(str(path))
    config = with_benchmark(load_config())
    assert config.environment.kind == "docker" and config.environment.cwd == "/testbed"
    first, second = plan_tasks(task_file, task_file.tasks, config, str(tmp_path / "run"))
    assert first.config.environment.image == "docker.io/swebench/sweb.eval.x86_64.django_1776_django-11099:latest"
    assert second.config.environment.image == "registry.example/own:tag"
    # settings given by the user: the CLI layers the file under them, so theirs win and the rest comes from it
    assert benchmark_sources(str(path)) == [os.path.join(ROOT, "config", "swebench.yaml")]
    assert benchmark_sources("verified") == benchmark_sources(str(path))
    layered = load_config(*benchmark_sources(str(path)), "environment.timeout=7")
    assert (layered.environment.kind, layered.environment.timeout, layered.environment.image) == ("docker", 7.0, "{image}")
    plain = tmp_path / "tasks.yaml"
    plain.write_text("- {id: a, task: x}\n")
    assert benchmark_sources(str(plain)) == [] and with_benchmark(load_config("environment.timeout=3")).environment.kind == "local"


@pytest.mark.skipif(NO_DATASETS, reason="the datasets extra is not installed (pip install -e '.[swebench]')")
def test_a_dataset_folder_loads_through_the_datasets_library_with_its_split(tmp_path):
    folder = tmp_path / "mybench"
    folder.mkdir()
    (folder / "test.jsonl").write_text("".join(json.dumps(instance_row(f"org__repo-{i}")) + "\n" for i in range(3)))
    (folder / "train.jsonl").write_text(json.dumps(instance_row("org__repo-9")) + "\n")
    test = load_task_list(str(folder))
    assert [t.id for t in test.tasks] == ["org__repo-0", "org__repo-1", "org__repo-2"] and test.split == "test"
    assert test.dataset == str(folder) and test.source == str(folder) and all(t.swebench for t in test.tasks)
    dev = load_task_list(str(folder), "train")
    assert [t.id for t in dev.tasks] == ["org__repo-9"] and dev.sha256 != test.sha256
    with pytest.raises(UsageError, match=r"cannot load dataset .*\(split nope\).*check the name and split"):
        load_task_list(str(folder), "nope")


@pytest.mark.skipif(NO_DATASETS, reason="the datasets extra is not installed (pip install -e '.[swebench]')")
def test_a_parquet_file_is_a_task_file(tmp_path):
    import pyarrow
    import pyarrow.parquet

    rows = [instance_row(f"org__repo-{i}") for i in range(2)]
    pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows), str(tmp_path / "lite.parquet"))
    task_file = load_task_list(str(tmp_path / "lite.parquet"))
    assert [t.id for t in task_file.tasks] == ["org__repo-0", "org__repo-1"] and task_file.tasks[0].where == "index 0"
    (tmp_path / "bad.parquet").write_text("not parquet")
    with pytest.raises(UsageError, match="not a readable Parquet file"):
        load_task_list(str(tmp_path / "bad.parquet"))


def test_a_missing_extra_is_one_line_naming_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if not installed: importing it fails
    with pytest.raises(UsageError) as caught:
        load_task_list("verified")
    assert str(caught.value) == ("loading the dataset 'verified' needs the datasets package: "
                                 "pip install -e '.[swebench]' in the miniswe checkout")


@pytest.mark.skipif(NO_SWEBENCH, reason="swebench is not installed (pip install -e '.[swebench]')")
def test_loading_the_harness_does_not_load_a_dotenv_into_miniswe(tmp_path):
    # the harness calls load_dotenv() at import: a .env beside the batch would reach local tasks' commands
    (tmp_path / ".env").write_text("MINISWE_TEST_FROM_DOTENV=leaked\n")
    code = ("import os; os.chdir(os.environ['WHERE']); from miniswe.swebench import require; "
            "require('swebench.harness.run_evaluation', 'grading'); print(os.environ.get('MINISWE_TEST_FROM_DOTENV'), "
            "os.environ.get('PYTHON_DOTENV_DISABLED'))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**clean_env(), "WHERE": str(tmp_path)},
                          timeout=300)
    assert done.stdout.split() == ["None", "None"], done.stdout + done.stderr


def test_grading_refuses_instances_the_harness_cannot_grade(tmp_path):
    from miniswe.swebench.grading import check_grading

    if NO_SWEBENCH:
        pytest.skip("the swebench extra is not installed")
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps(instance_row("org__repo-1")) + "\n")
    problem = check_grading(load_task_list(str(path)).tasks)
    assert "has no eval_script, log_parser, eval_type" in problem and "load the dataset by name" in problem
    options = BatchOptions(str(path), str(tmp_path / "run"), grade=True)
    with pytest.raises(UsageError, match="^--grade: instance org__repo-1 has no eval_script"):
        run_batch(load_config("model.kind=scripted", f"model.script={path}"), options)


def test_the_report_counts_grades_apart_and_names_each_reason():
    from miniswe.batch.ledger import LedgerRecord
    from miniswe.batch.report import build_report, render_markdown

    def graded(task_id, status, resolved, detail, wall):
        grade = {"status": status, "resolved": resolved, "detail": detail, "wall_s": wall, "harness": "swebench 5.0.2"}
        return LedgerRecord(task_id, "Submitted", resolved=resolved, has_eval=True, wall_s=10.0, grade=grade)

    records = [graded("a", "resolved", True, "FAIL_TO_PASS 1/1 passed, PASS_TO_PASS 2/2 passed", 4.0),
               graded("b", "patch_failed", False, "the patch does not apply: error: corrupt patch at line 7", 1.0),
               graded("c", "image_unavailable", None, "cannot pull image x: not found; build or load it locally", 1.0)]
    report = build_report(records)
    assert (report["resolved"], report["evaluated"]) == (1, 3)
    assert report["grading"]["by_status"] == {"resolved": 1, "patch_failed": 1, "image_unavailable": 1}
    assert report["grading"]["total_wall_s"] == 6.0 and report["wall_s"]["max"] == 10.0  # the agents' time apart
    text = render_markdown(report, records, None, "run")
    assert "**resolved 1 of 3** graded" in text and "## Grading (3 graded by swebench 5.0.2)" in text
    assert "| `b` | patch_failed | no | the patch does not apply: error: corrupt patch at line 7 |" in text
    assert "| `c` | image_unavailable | not graded | cannot pull image x" in text
    assert "`miniswe evaluate run`" in text


# -- a real instance, offline ------------------------------------------------------------------------------------
SLUG = '''def slugify(text):
    """Lower-case words joined by single dashes."""
    return "-".join(text.lower().split(" "))
'''
TESTS = '''from textkit.slug import slugify


def test_simple():
    assert slugify("Hello World") == "hello-world"


def test_lower():
    assert slugify("ABC") == "abc"
'''
TEST_PATCH = '''diff --git a/tests/test_slug.py b/tests/test_slug.py
--- a/tests/test_slug.py
+++ b/tests/test_slug.py
@@ -7,3 +7,7 @@ def test_simple():
 
 def test_lower():
     assert slugify("ABC") == "abc"
+
+
+def test_runs_of_spaces():
+    assert slugify("Hello   big  World") == "hello-big-world"
'''
GOLD_PATCH = '''diff --git a/textkit/slug.py b/textkit/slug.py
--- a/textkit/slug.py
+++ b/textkit/slug.py
@@ -1,3 +1,3 @@
 def slugify(text):
     """Lower-case words joined by single dashes."""
-    return "-".join(text.lower().split(" "))
+    return "-".join(text.lower().split())
'''
# conda is not installable offline: this stands in for its activate script, so the eval script runs as it is.
ACTIVATE = '''# miniswe test stand-in for conda's activate script: `conda activate ENV` puts that env's bin/ first on PATH
conda() {
    if [ "${1:-}" = activate ]; then
        export CONDA_DEFAULT_ENV="${2:-base}" PATH="/opt/miniconda3/envs/${2:-base}/bin:$PATH"
    fi
}
export PATH="/opt/miniconda3/bin:$PATH"
'''
SETUP = r'''set -euo pipefail
mkdir -p /opt/miniconda3/bin /opt/miniconda3/envs
cp /build/activate /opt/miniconda3/bin/activate
python3 -m venv --without-pip /opt/miniconda3/envs/testbed
site=$(/opt/miniconda3/envs/testbed/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
cp -r /build/site/. "$site/"
echo /testbed > "$site/textkit.pth"  # the repository installed in the env, as `pip install -e .` leaves it
printf '#!/opt/miniconda3/envs/testbed/bin/python\nimport sys\nimport pytest\nsys.exit(pytest.main())\n' \
    > /opt/miniconda3/envs/testbed/bin/pytest
chmod +x /opt/miniconda3/envs/testbed/bin/pytest
cp -r /build/repo /testbed
cd /testbed
export GIT_AUTHOR_DATE=2024-01-01T00:00:00Z GIT_COMMITTER_DATE=2024-01-01T00:00:00Z
git init -q && git add -A && git -c user.name=textkit -c user.email=textkit@example.invalid commit -qm "textkit 1.0"
git rev-parse HEAD > /base_commit
'''
# pytest and what it imports, copied from this environment (pure Python, and the image's python is 3.11 too)
PYTEST_PACKAGES = ("pytest", "_pytest", "pluggy", "iniconfig", "packaging", "pygments", "py.py")


def eval_script(base_commit: str) -> str:
    """The instance's eval script, in the shape the harness gives a pytest repository's instances: conda activation,
    the test files reset and the test patch applied, the tests between the markers, the test files reset again."""
    files = "tests/test_slug.py"
    return "\n".join([
        "#!/bin/bash", "set -uxo pipefail",
        "source /opt/miniconda3/bin/activate", "conda activate testbed", "cd /testbed",
        "git config --global --add safe.directory /testbed", "cd /testbed", "git status", "git show",
        f"git -c core.fileMode=false diff {base_commit}",
        "source /opt/miniconda3/bin/activate", "conda activate testbed",
        f"git checkout {base_commit} {files}",
        "git apply -v - <<'EOF_114329324912'", TEST_PATCH.rstrip("\n"), "EOF_114329324912",
        ": '>>>>> Start Test Output'", f"pytest -rA {files}", ": '>>>>> End Test Output'",
        f"git checkout {base_commit} {files}",
    ]) + "\n"


def _engine_problem() -> str | None:
    if shutil.which("docker") is None:
        return "no `docker` on PATH"
    try:
        info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return "`docker info` hung"
    if info.returncode:
        return f"`docker info` failed: {(info.stderr.strip().splitlines() or ['?'])[-1]}"
    if subprocess.run(["docker", "image", "inspect", BASE_IMAGE], capture_output=True).returncode:
        return f"image {BASE_IMAGE} missing"
    return None


@pytest.fixture(scope="module")
def instance_image():
    """The instance image, built once per engine and base image (whichever test process asks first): its tag
    carries the base image's id and this recipe's hash, so a changed recipe builds anew."""
    if NO_SWEBENCH:
        pytest.skip("the swebench extra is not installed (pip install -e '.[swebench]')")
    problem = _engine_problem()
    if problem and os.environ.get("MINISWE_REQUIRE_DOCKER"):
        raise RuntimeError(f"MINISWE_REQUIRE_DOCKER is set but there is no Docker engine: {problem}")
    if problem:
        pytest.skip(f"no Docker engine ({problem}); run `.ci/docker-engine start`")
    import hashlib

    base = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", BASE_IMAGE], capture_output=True, text=True)
    recipe = hashlib.sha256((SLUG + TESTS + ACTIVATE + SETUP + repr(PYTEST_PACKAGES) + "dist-info").encode()).hexdigest()[:8]
    tag = f"miniswe-swebench/sweb.eval.x86_64.miniswe_1776_textkit-1:{base.stdout.strip().removeprefix('sha256:')[:12]}-{recipe}"
    with open(os.path.join(tempfile.gettempdir(), "miniswe-test-images.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode:
            _build(tag)
    base_commit = subprocess.run(["docker", "run", "--rm", "--entrypoint", "cat", tag, "/base_commit"],
                                 capture_output=True, text=True, timeout=60).stdout.strip()
    assert len(base_commit) == 40, base_commit
    return tag, base_commit


def _build(tag: str) -> None:
    import pytest as pytest_module

    site = Path(pytest_module.__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory() as context:
        build = Path(context)
        (build / "site").mkdir()
        for name in PYTEST_PACKAGES:
            source = site / name
            if source.is_dir():
                shutil.copytree(source, build / "site" / name, ignore=shutil.ignore_patterns("__pycache__"))
            elif source.exists():
                shutil.copy(source, build / "site" / name)
            for info in site.glob(f"{name}-*.dist-info"):  # pytest asks importlib.metadata for versions
                shutil.copytree(info, build / "site" / info.name)
        (build / "repo" / "textkit").mkdir(parents=True)
        (build / "repo" / "tests").mkdir()
        (build / "repo" / "textkit" / "__init__.py").write_text("")
        (build / "repo" / "textkit" / "slug.py").write_text(SLUG)
        (build / "repo" / "tests" / "test_slug.py").write_text(TESTS)
        (build / "activate").write_text(ACTIVATE)
        (build / "setup.sh").write_text(SETUP)
        (build / "Dockerfile").write_text(f"FROM {BASE_IMAGE}\nCOPY . /build\nRUN bash /build/setup.sh && rm -rf /build\n")
        built = subprocess.run(["docker", "build", "-q", "-t", tag, context], capture_output=True, text=True, timeout=600,
                               env={**os.environ, "DOCKER_BUILDKIT": "0"})
        assert built.returncode == 0, built.stderr


def write_instance(folder: Path, image: str, base_commit: str, count: int = 1, **changes) -> Path:
    instance = {
        "instance_id": INSTANCE_ID, "repo": "miniswe/textkit", "version": "1.0", "base_commit": base_commit,
        "environment_setup_commit": base_commit, "created_at": "2024-01-01T00:00:00Z", "hints_text": "",
        "problem_statement": 'slugify("Hello   big  World") gives "hello---big--world": runs of spaces should make one dash.',
        "patch": GOLD_PATCH, "test_patch": TEST_PATCH,
        "FAIL_TO_PASS": json.dumps(["tests/test_slug.py::test_runs_of_spaces"]),
        "PASS_TO_PASS": json.dumps(["tests/test_slug.py::test_simple", "tests/test_slug.py::test_lower"]),
        "image": image, "eval_script": eval_script(base_commit), "log_parser": "parse_log_pytest", "eval_type": "pass_and_fail",
        **changes,
    }
    path = folder / "instances.json"
    more = [{**instance, "instance_id": INSTANCE_ID.replace("-1", f"-{n}")} for n in range(2, count + 1)]
    path.write_text(json.dumps([instance, *more], indent=1))
    return path


def replies(folder: Path, name: str, command: str) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump([
        f"THOUGHT: I change slugify.\n\n```bash\n{command}\n```\n",
        "THOUGHT: Submitting.\n\n```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git diff\n```\n",
    ]))
    return path


RIGHT = """sed -i 's/split(" ")/split()/' textkit/slug.py"""
WRONG = """sed -i 's/text.lower()/text.strip().lower()/' textkit/slug.py"""  # applies, and fixes nothing


def engine_events(since: float, kind: str, action: str) -> list[str]:
    """Names of the engine's `kind` objects that had `action` since then (container starts, image pulls)."""
    found = subprocess.run(["docker", "events", "--since", f"{since:.3f}", "--until", f"{time.time():.3f}",
                            "--filter", f"type={kind}", "--filter", f"event={action}", "--format", "{{json .}}"],
                           capture_output=True, text=True, timeout=60)
    names = []
    for line in found.stdout.splitlines():
        event = json.loads(line)
        names.append(((event.get("Actor") or {}).get("Attributes") or {}).get("name") or event.get("id") or "")
    return names


def harness(tmp_path: Path, preds: Path, dataset: Path, run_id: str) -> dict:
    """The official harness's run over preds.json, its report as it writes it; the docker SDK reaches this engine."""
    work = tmp_path / f"harness-{run_id}"
    work.mkdir()
    done = subprocess.run([sys.executable, "-m", "swebench.harness.run_evaluation", "--predictions_path", str(preds),
                           "--dataset_name", str(dataset), "--run_id", run_id, "--max_workers", "1", "--timeout", "300",
                           "--report_dir", str(work)], cwd=work, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "TQDM_DISABLE": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [report] = list(work.glob(f"*.{run_id}.json"))
    return json.loads(report.read_text())


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.xdist_group("swebench-image")
def test_grading_in_the_run_agrees_with_the_official_harness(tmp_path, instance_image):
    image, base_commit = instance_image
    dataset = write_instance(tmp_path, image, base_commit)
    since = time.time()
    runs = {}
    timings = {}
    for name, command in (("right", RIGHT), ("wrong", WRONG)):
        config = load_config({"model": {"kind": "scripted", "script": str(replies(tmp_path, name, command))}})
        started = time.monotonic()
        result = run_batch(config, BatchOptions(str(dataset), str(tmp_path / name), quiet=True, grade=True, grade_timeout=300))
        timings[name] = time.monotonic() - started
        assert result.exit_code == 0, result.markdown
        runs[name] = json.loads((tmp_path / name / "results.jsonl").read_text().splitlines()[-1])

    right, wrong = runs["right"], runs["wrong"]
    assert right["exit_status"] == "Submitted" and right["resolved"] is True and right["has_eval"] is True
    assert right["grade"]["status"] == "resolved" and right["grade"]["tests"] == {
        "FAIL_TO_PASS": {"success": ["tests/test_slug.py::test_runs_of_spaces"], "failure": []},
        "PASS_TO_PASS": {"success": ["tests/test_slug.py::test_simple", "tests/test_slug.py::test_lower"], "failure": []},
    }
    assert wrong["resolved"] is False and wrong["grade"]["status"] == "unresolved"
    assert wrong["grade"]["tests"]["FAIL_TO_PASS"] == {"success": [], "failure": ["tests/test_slug.py::test_runs_of_spaces"]}
    assert wrong["grade"]["detail"] == "FAIL_TO_PASS 0/1 passed, PASS_TO_PASS 2/2 passed"
    assert right["grade"]["wall_s"] > 0 and right["grade"]["harness"].startswith("swebench ")
    # the agent's container is not the grading one: the agent's change stays in its own, and the test patch in neither
    log = (tmp_path / "right" / INSTANCE_ID / "grade" / "test_output.txt").read_text()
    assert ">>>>> Start Test Output" in log and "PASSED tests/test_slug.py::test_runs_of_spaces" in log
    report = (tmp_path / "right" / "report.md").read_text()
    assert "**resolved 1 of 1** graded" in report and "## Grading (1 graded by swebench " in report

    # the same preds.json, graded by the official harness against the same image
    official = {name: harness(tmp_path, tmp_path / name / "preds.json", dataset, f"miniswe-{name}-{uuid.uuid4().hex[:6]}")
                for name in ("right", "wrong")}
    for name in ("right", "wrong"):
        ours = {INSTANCE_ID} if runs[name]["resolved"] else set()
        assert set(official[name]["resolved_ids"]) == ours, (name, official[name])
        assert official[name]["completed_ids"] == [INSTANCE_ID] and not official[name]["error_ids"]

    # one agent container and one grading container per batch, one per harness run; nothing pulled
    starts = [n for n in engine_events(since, "container", "start") if "textkit-1" in n]
    assert len(starts) == 6, starts
    assert len([n for n in starts if n.startswith("sweb.eval.")]) == 2
    assert len([n for n in starts if n.endswith("-grade")]) == 2
    # (the engine is shared: another test's pulls, run alongside, are not this one's)
    assert [n for n in engine_events(since, "image", "pull") if "sweb." in n or "textkit" in n] == []
    print(f"\ncontainer starts: {len(starts)} ({starts}); image pulls: 0; batch wall: "
          + ", ".join(f"{k} {v:.1f}s" for k, v in timings.items())
          + f"; grading: right {right['grade']['wall_s']:.1f}s, wrong {wrong['grade']['wall_s']:.1f}s")


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.xdist_group("swebench-image")
def test_evaluate_regrades_a_finished_batch_and_inspect_shows_the_tests(tmp_path, instance_image, capsys):
    from miniswe.inspector import InspectOptions, inspect_paths
    from miniswe.batch.evaluate import evaluate

    image, base_commit = instance_image
    dataset = write_instance(tmp_path, image, base_commit)
    config = load_config({"model": {"kind": "scripted", "script": str(replies(tmp_path, "right", RIGHT))}})
    run = tmp_path / "run"
    first = run_batch(config, BatchOptions(str(dataset), str(run), quiet=True, grade=False))
    assert first.exit_code == 0 and first.report["grading"] is None
    assert json.loads((run / "results.jsonl").read_text())["resolved"] is None

    graded = subprocess.run([sys.executable, "-m", "miniswe", "evaluate", str(run), "-q"], capture_output=True, text=True,
                            env=clean_env(), timeout=600)  # as a user types it
    assert graded.returncode == 0, graded.stderr
    record = json.loads((run / "results.jsonl").read_text().splitlines()[-1])
    assert record["grade"]["status"] == "resolved" and record["steps"] == 2  # the agent did not run again
    assert record["resolved"] is True
    again = evaluate(str(run), quiet=True)  # nothing left to grade
    assert again.ran == 0 and again.report["resolved"] == 1
    assert evaluate(str(run), quiet=True, regrade=True).ran == 1
    run_json = json.loads((run / "run.json").read_text())
    assert run_json["invocations"][-1]["command"] == f"miniswe evaluate {run}"  # the batch's rerun command stays its own
    assert not (run_json.get("command") or "").startswith("miniswe evaluate")

    inspect_paths([str(run)], InspectOptions(json=True))
    row = json.loads(capsys.readouterr().out)["rows"][0]
    assert row["resolved"] is True and row["grade"]["tests"]["FAIL_TO_PASS"]["success"] == ["tests/test_slug.py::test_runs_of_spaces"]
    inspect_paths([str(run)], InspectOptions(pager=False))
    text = capsys.readouterr().out
    assert "grading" in text and "FAIL_TO_PASS 1/1 · PASS_TO_PASS 2/2" in text
    inspect_paths([str(run / INSTANCE_ID / f"{INSTANCE_ID}.traj.json")], InspectOptions(pager=False))
    assert "resolved · FAIL_TO_PASS 1/1 passed, PASS_TO_PASS 2/2 passed" in capsys.readouterr().out
    page = tmp_path / "page.html"
    inspect_paths([str(run)], InspectOptions(html=str(page)))
    html = page.read_text()
    assert "testsBlock" in html and "tests/test_slug.py::test_runs_of_spaces" in html


@pytest.mark.docker
@pytest.mark.xdist_group("swebench-image")
def test_each_way_grading_fails_is_its_own_outcome(tmp_path, instance_image):
    from miniswe.environments.docker import DockerConfig
    from miniswe.swebench.grading import grade_patch

    image, base_commit = instance_image
    instance = json.loads(write_instance(tmp_path, image, base_commit).read_text())[0]
    environment = DockerConfig(image=image, cwd="/testbed", pull="never")

    def grade(patch, name, timeout=120.0, stop=None, **changes):
        return grade_patch({**instance, **changes}, patch, environment, run_id=f"test-{uuid.uuid4().hex[:8]}-{name}",
                           folder=str(tmp_path / name / "grade"), timeout=timeout, stop=stop)

    empty = grade("", "empty")
    assert (empty["status"], empty["resolved"], empty["detail"]) == ("empty_patch", False, "no patch was submitted")
    torn = grade(GOLD_PATCH.replace("split(\" \")", "split(\"x\")"), "torn")
    assert torn["status"] == "patch_failed" and torn["resolved"] is False and "does not apply" in torn["detail"]
    slow = grade(GOLD_PATCH, "slow", timeout=3, eval_script=eval_script(base_commit).replace("pytest -rA", "sleep 60; pytest -rA"))
    assert slow["status"] == "eval_timeout" and slow["resolved"] is False and "3s timeout" in slow["detail"]
    gone = grade(GOLD_PATCH, "gone", image="miniswe-no-such-image:never")
    assert gone["status"] == "image_unavailable" and gone["resolved"] is None and "is not present" in gone["detail"]
    assert json.loads((tmp_path / "gone" / "grade" / "grade.json").read_text())["status"] == "image_unavailable"
    from miniswe.signals import Stop
    from miniswe.status import interrupted

    stop = Stop()
    stop.request(interrupted("SIGINT"))
    stopped = grade(GOLD_PATCH, "stopped", stop=stop)
    assert stopped["status"] == "interrupted" and stopped["resolved"] is None and "miniswe evaluate" in stopped["detail"]


def concurrency(since: float, marker: str) -> int:
    """The most containers whose name holds `marker` that ran at once since then, by the engine's events."""
    found = subprocess.run(["docker", "events", "--since", f"{since:.3f}", "--until", f"{time.time():.3f}", "--filter",
                            "type=container", "--format", "{{json .}}"], capture_output=True, text=True, timeout=60)
    running, most = set(), 0
    for line in found.stdout.splitlines():
        event = json.loads(line)
        name = ((event.get("Actor") or {}).get("Attributes") or {}).get("name") or ""
        action = event.get("Action") or event.get("status")
        if marker in name and action == "start":
            running.add(name)
        elif marker in name and action == "die":
            running.discard(name)
        most = max(most, len(running))
    return most


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.xdist_group("swebench-image")
def test_grading_overlaps_other_tasks_agent_work_within_the_worker_limit(tmp_path, instance_image):
    image, base_commit = instance_image
    dataset = write_instance(tmp_path, image, base_commit, count=3)
    # the first task is quick; the others take their time, so the first one's grading runs beside their agents
    script = tmp_path / "{id}.yaml"
    replies(tmp_path, INSTANCE_ID, RIGHT)
    for n in (2, 3):
        replies(tmp_path, INSTANCE_ID.replace("-1", f"-{n}"), "sleep 6; " + RIGHT)
    since = time.time()
    config = load_config({"model": {"kind": "scripted", "script": str(script)}})
    result = run_batch(config, BatchOptions(str(dataset), str(tmp_path / "run"), workers=2, quiet=True, grade=True))
    assert result.exit_code == 0 and result.report["resolved"] == 3, result.markdown
    records = {r["id"]: r for r in map(json.loads, (tmp_path / "run" / "results.jsonl").read_text().splitlines())}
    quick, slow = records[INSTANCE_ID], records[INSTANCE_ID.replace("-1", "-2")]
    assert quick["grade"]["started"] < slow["ended"]  # graded while the other task's agent worked, not after
    assert concurrency(since, "textkit-") <= 2  # the grading containers count against the two workers
    assert result.report["grading"]["graded"] == 3 and result.report["grading"]["total_wall_s"] > 0
