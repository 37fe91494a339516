"""A third-party environment, written as the README shows it, loaded by `package.module:Class` from config."""

from __future__ import annotations

import json
import re

from conftest import ROOT, SUBMIT, act


def readme_plugin() -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## How it fits together"):text.index("## Development")]
    return re.search(r"```python\n(.*?)```", section, re.S)[1]


def test_the_readme_example_environment_runs_a_task(cli, tmp_path):
    (tmp_path / "my_envs.py").write_text(readme_plugin())
    script = tmp_path / "replies.json"
    script.write_text(json.dumps([act("echo niceness=$(nice)"), SUBMIT]))
    result = cli("run", "x", "--script", str(script), "-o", "t.json", "-q",
                 "-c", "environment.kind=my_envs:NiceEnvironment", "-c", "environment.niceness=15",
                 env={"PYTHONPATH": f"{tmp_path}:{ROOT}"})
    assert result.returncode == 0, result.stderr
    data = json.loads((tmp_path / "t.json").read_text())
    assert data["steps"][0]["output"] == "niceness=15\n"
    assert data["environment"] == {"kind": "nice", "cwd": str(tmp_path), "niceness": 15}
    assert data["config"]["environment"]["niceness"] == 15 and data["exit_status"] == "Submitted"


def test_a_plugin_kind_gets_its_own_keys_checked(cli, tmp_path):
    (tmp_path / "my_envs.py").write_text(readme_plugin())
    env = {"PYTHONPATH": f"{tmp_path}:{ROOT}"}
    typo = cli("run", "x", "--script", "r.json", "-c", "environment.kind=my_envs:NiceEnvironment",
               "-c", "environment.nicenes=3", env=env)
    assert typo.returncode == 2
    assert typo.stderr.strip() == "miniswe: -c environment.nicenes=3: environment.nicenes: unknown key (did you mean 'niceness'?)"
    missing = cli("run", "x", "--script", "r.json", "-c", "environment.kind=no_such_pkg.envs:Env", env=env)
    assert missing.returncode == 2
    assert "environment.kind: cannot import no_such_pkg.envs" in missing.stderr and "PYTHONPATH" in missing.stderr
    no_class = cli("run", "x", "--script", "r.json", "-c", "environment.kind=my_envs:Nope", env=env)
    assert no_class.returncode == 2 and "my_envs has no class 'Nope'" in no_class.stderr


def readme_hook() -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Hooks, loop detection and the command policy"):text.index("## Replay, resume and fork")]
    return re.search(r"```python\n(.*?)```", section, re.S)[1]


def test_the_readme_example_hook_audits_refuses_and_warns(cli, tmp_path):
    (tmp_path / "audit.py").write_text(readme_hook())
    script = tmp_path / "replies.json"
    script.write_text(json.dumps([act("wget http://example.invalid/x"), act("false"), SUBMIT]))
    result = cli("run", "x", "--script", str(script), "-o", "t.json", "-q", "-c", "agent.hooks=[audit:Audit]",
                 env={"PYTHONPATH": f"{tmp_path}:{ROOT}"})
    assert result.returncode == 0, result.stderr
    log = [json.loads(line) for line in (tmp_path / "audit.log").read_text().splitlines()]
    assert [entry.get("command") for entry in log[:3]] == ["wget http://example.invalid/x", "false", SUBMIT.split("\n")[3]]
    assert log[0]["refused"].startswith("downloads are not allowed") and log[-1] == {"end": "Submitted"}
    data = json.loads((tmp_path / "t.json").read_text())
    assert "That command failed" in data["messages"][5]["content"]


def test_a_hook_that_cannot_load_or_raises_is_one_line(cli, tmp_path):
    (tmp_path / "bad.py").write_text("class Raises:\n    def before_command(self, event):\n        raise KeyError('oops')\n"
                                     "class Nothing:\n    pass\n")
    script = tmp_path / "replies.json"
    script.write_text(json.dumps([act("true"), SUBMIT]))
    env = {"PYTHONPATH": f"{tmp_path}:{ROOT}"}
    raised = cli("run", "x", "--script", str(script), "-o", "t.json", "-q", "-c", "agent.hooks=[bad:Raises]", env=env)
    assert raised.returncode == 3 and len(raised.stderr.strip().splitlines()) == 1
    assert "hook bad.Raises.before_command raised KeyError: 'oops'" in raised.stderr
    empty = cli("run", "x", "--script", str(script), "-o", "e.json", "-q", "-c", "agent.hooks=[bad:Nothing]", env=env)
    assert empty.returncode == 2 and "has none of the hook methods" in empty.stderr and not (tmp_path / "e.json").exists()
