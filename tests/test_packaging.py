"""A non-editable install finds its shipped config/ and templates/ and runs from outside the checkout."""

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, SUBMIT, act, clean_env

pytestmark = pytest.mark.slow


def test_wheel_install_runs_help_and_a_full_scripted_run(tmp_path):
    target = tmp_path / "site"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "--target", str(target), str(ROOT)],
        capture_output=True, text=True, timeout=300,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    assert (target / "miniswe" / "config" / "default.yaml").is_file()
    assert (target / "miniswe" / "templates" / "system.j2").is_file()
    assert (target / "miniswe" / "inspector" / "page.js").is_file() and (target / "miniswe" / "inspector" / "page.css").is_file()

    env = clean_env()
    env["PYTHONPATH"] = str(target)  # the installed copy only, not the checkout
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    script = outside / "replies.json"
    script.write_text(json.dumps([act("echo installed-ok"), SUBMIT]))

    help_run = subprocess.run([str(target / "bin" / "miniswe"), "--help"], capture_output=True, text=True, env=env, cwd=outside)
    assert help_run.returncode == 0 and "run" in help_run.stdout, help_run.stderr

    run = subprocess.run(
        [sys.executable, "-m", "miniswe", "run", "check install", "--script", str(script), "-o", "t.json", "-q"],
        capture_output=True, text=True, env=env, cwd=outside, timeout=60,
    )
    assert run.returncode == 0, run.stderr
    data = json.loads((outside / "t.json").read_text())
    assert data["steps"][0]["output"] == "installed-ok\n"
    page = subprocess.run([sys.executable, "-m", "miniswe", "inspect", "t.json", "--html", "t.html"],
                          capture_output=True, text=True, env=env, cwd=outside, timeout=60)
    assert page.returncode == 0 and "installed-ok" in (outside / "t.html").read_text(), page.stderr
    import miniswe

    assert os.path.dirname(miniswe.__file__) != str(target / "miniswe")
    loaded = subprocess.run([sys.executable, "-c", "import miniswe; print(miniswe.__file__)"], capture_output=True, text=True, env=env, cwd=outside)
    assert loaded.stdout.strip().startswith(str(target))
