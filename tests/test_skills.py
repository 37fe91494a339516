"""Skills: folders with a SKILL.md, listed in the system prompt, read on demand with `miniswe skill` from a command or
with the `skill` tool, jailed to their folder; malformed ones reported at start, one line each, and left out."""

import json
import os

from miniswe.config import load_config
from miniswe.runner import run_task
from miniswe.status import ExitStatus

from replies import SUBMIT, TOOL_SUBMIT, act, call, calls


def endpoint(server):
    return ["--base-url", server.base_url, "-m", "test-model"]


def skill(root, folder, text, files=None):
    (root / folder).mkdir(parents=True)
    if text is not None:
        (root / folder / "SKILL.md").write_text(text)
    for name, content in (files or {}).items():
        path = root / folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)


def skills_root(tmp_path):
    root = tmp_path / "skills"
    skill(root, "release-notes", "---\nname: release-notes\ndescription: Use when asked for a changelog.\n---\n"
          "Group the commits as features, fixes and breaking changes.\n",
          {"references/style.md": "Lead with what users see.\n", "scripts/collect.sh": "git log --oneline\n"})
    skill(root, "db", "---\nname: db\ndescription: Use for schema migrations.\n---\nWrite a migration, never edit old ones.\n")
    skill(root, "no-front", "Just some text.\n")
    skill(root, "Mixed", "---\nname: mixed\ndescription: x\n---\nbody\n")
    skill(root, "two-lines", "---\nname: two-lines\ndescription: |\n  first\n  second\n---\nbody\n")
    skill(root, "empty-body", "---\nname: empty-body\ndescription: nothing below\n---\n\n")
    skill(root, "broken-yaml", "---\nname: [broken\n---\nbody\n")
    skill(root, "too-deep", "---\nname: too-deep\ndescription: " + "[" * 3000 + "]" * 3000 + "\n---\nbody\n")
    skill(root, "missing", None)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text("not for skills\n")
    os.symlink(tmp_path / "outside", root / "db" / "door")
    return root


PROBLEMS = {"no-front": "does not start with front matter", "Mixed": "its name 'mixed' is not its folder's ('Mixed')",
            "two-lines": "its description must be one line", "empty-body": "has no instructions after its front matter",
            "broken-yaml": "its front matter is not valid YAML", "missing": "no SKILL.md",
            "too-deep": "its front matter is nested too deeply to read"}


def test_skills_are_listed_read_from_the_shell_and_malformed_ones_reported(cli, server, tmp_path):
    root = skills_root(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    server.push(act("miniswe skill release-notes"), act("miniswe skill release-notes references/style.md"),
                act("miniswe skill db ../release-notes/SKILL.md; echo rc=$?"), act("miniswe skill db door/secret.txt"),
                act("miniswe skill relase-notes"), act("miniswe skill"), SUBMIT)
    result = cli("run", "x", *endpoint(server), "--cwd", str(work), "-c", f"agent.skills_dirs=[{root}]", "-o", "t.json")
    assert result.returncode == 0, result.stderr
    start = result.stderr.split("--- step 1")[0]  # what the run said at start (the steps show commands' output)
    reported = [line for line in start.splitlines() if line.startswith("miniswe: skill ")]
    assert len(reported) == len(PROBLEMS)
    for folder, problem in PROBLEMS.items():
        line, = [line for line in reported if f"{root / folder}:" in line]
        assert problem in line and line.endswith("; left out")
    system = server.requests[0]["body"]["messages"][0]["content"]
    assert "- db: Use for schema migrations.\n- release-notes: Use when asked for a changelog.\n" in system
    assert "`miniswe skill NAME` prints one" in system and "two-lines" not in system and "mixed" not in system
    steps = json.loads((tmp_path / "t.json").read_text())["steps"]
    body = steps[0]["output"]
    assert body.startswith("# skill release-notes: Use when asked for a changelog.\n\nGroup the commits")
    assert "- references/style.md\n- scripts/collect.sh" in body and str(root / "release-notes") in body
    assert steps[1]["output"] == "Lead with what users see.\n"
    assert "outside the skill's folder" in steps[2]["output"] and "rc=2" in steps[2]["output"]
    assert "outside the skill's folder" in steps[3]["output"] and "not for skills" not in steps[3]["output"]
    assert "no skill 'relase-notes' (did you mean 'release-notes'?)" in steps[4]["output"]
    assert "db: Use for schema migrations.\nrelease-notes: Use when asked for a changelog.\n" in steps[5]["output"]
    warnings = json.loads((tmp_path / "t.json").read_text())["warnings"]
    assert sum("left out" in w for w in warnings) == len(PROBLEMS)


def test_the_skill_tool_reads_a_skill_jailed_to_its_folder(tmp_path):
    root = skills_root(tmp_path)
    script = tmp_path / "replies.json"
    script.write_text(json.dumps([calls(call("skill", name="db"), call("skill", name="db", file="door/secret.txt"),
                                        call("skill", name="release-notes", file="references/style.md"),
                                        call("skill", name="nope"), call("skill", name="db", file="/etc/passwd")),
                                  TOOL_SUBMIT]))
    config = load_config("model.kind=scripted", f"model.script={script}", f"environment.cwd={tmp_path}",
                         "protocol.kind=tools", f"agent.skills_dirs=[{root}]")
    result = run_task(config, "x", str(tmp_path / "t.traj.json"))
    assert result.outcome.status is ExitStatus.SUBMITTED
    steps = result.trajectory.steps
    assert steps[0].output.startswith("# skill db: Use for schema migrations.") and steps[0].returncode == 0
    assert steps[0].command == "skill db"
    assert steps[1].returncode == 1 and "outside the skill's folder" in steps[1].output
    assert steps[2].output == "Lead with what users see.\n"
    assert steps[3].output.startswith("error: no skill 'nope'")
    assert "relative to the skill's folder" in steps[4].output
    system = result.trajectory.messages[0].content
    assert "(with the `skill` tool)" in system and "- db: Use for schema migrations." in system


def test_miniswe_skill_lists_and_prints_skills_of_the_config(cli, tmp_path):
    root = skills_root(tmp_path)
    listed = cli("skill", "-c", f"agent.skills_dirs=[{root}]")
    assert listed.returncode == 0
    assert listed.stdout == "db: Use for schema migrations.\nrelease-notes: Use when asked for a changelog.\n"
    assert listed.stderr.count("left out") == len(PROBLEMS)
    shown = cli("skill", "db", "-c", f"agent.skills_dirs=[{root}]")
    assert shown.returncode == 0 and "Write a migration, never edit old ones." in shown.stdout
    missing = cli("skill", "db", "nothing.md", "-c", f"agent.skills_dirs=[{root}]")
    assert missing.returncode == 2 and "skill db has no file nothing.md" in missing.stderr
    from_env = cli("skill", "db", env={"MINISWE_SKILLS": str(root)})
    assert from_env.returncode == 0 and from_env.stdout == shown.stdout


def test_a_skill_folder_given_as_a_root_is_reported(cli, server, tmp_path):
    root = skills_root(tmp_path)
    server.push(SUBMIT)
    result = cli("run", "x", *endpoint(server), "--cwd", str(tmp_path), "-c", f"agent.skills_dirs=[{root / 'db'}]",
                 "-o", "t.json")
    assert result.returncode == 0
    assert f"agent.skills_dirs: {root / 'db'} is a skill itself; give the folder that holds it ({root})" in result.stderr
    assert "Skills:" not in server.requests[0]["body"]["messages"][0]["content"]
