"""Task files (YAML, JSON, JSONL, SWE-bench instances), their validation, per-task settings, and task selection."""

import json
import os

import pytest

from miniswe.batch.plan import plan_task, plan_tasks
from miniswe.batch.selection import select_tasks, shard_of
from miniswe.batch.tasks import load_tasks
from miniswe.config import load_config
from miniswe.errors import TaskFileError, UsageError

SWEBENCH = {
    "instance_id": "astropy__astropy-12907", "repo": "astropy/astropy", "base_commit": "d16bfe05a744909de4b27f5875fe0d4ed41ce607",
    "problem_statement": "Modeling's `separability_matrix` does not compute separability correctly for nested CompoundModels",
    "patch": "diff --git a/x b/x", "test_patch": "diff --git a/t b/t", "version": "4.3", "FAIL_TO_PASS": "[\"t1\"]",
}


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def problems(tmp_path, name, text):
    with pytest.raises(TaskFileError) as caught:
        load_tasks(write(tmp_path, name, text))
    return str(caught.value)


def test_yaml_task_with_every_field(tmp_path):
    path = write(tmp_path, "t.yaml", """
- id: fix-1
  task: Fix the bug
  cwd: repo
  setup: git init -q
  eval: [make test, make lint]
  env: {timeout: 5}
  config: {agent: {step_limit: 7}}
  metadata: {difficulty: easy}
""")
    [task] = load_tasks(path).tasks
    assert (task.id, task.text, task.cwd) == ("fix-1", "Fix the bug", "repo")
    assert task.setup == ("git init -q",) and task.evaluate == ("make test", "make lint")
    assert task.env == {"timeout": 5} and task.config == {"agent": {"step_limit": 7}}
    assert task.metadata == {"difficulty": "easy"} and task.where == "line 2" and not task.swebench


def test_json_and_jsonl_and_the_file_hash(tmp_path):
    entries = [{"id": "a", "task": "x"}, {"id": "b", "task": "y"}]
    as_json = load_tasks(write(tmp_path, "t.json", json.dumps(entries)))
    as_jsonl = load_tasks(write(tmp_path, "t.jsonl", "\n".join(json.dumps(e) for e in entries) + "\n\n"))
    assert [t.id for t in as_json.tasks] == [t.id for t in as_jsonl.tasks] == ["a", "b"]
    assert as_jsonl.tasks[1].where == "line 2" and as_json.tasks[1].where == "index 1"
    assert len(as_json.sha256) == 64 and as_json.sha256 != as_jsonl.sha256


def test_swebench_instances_are_accepted_as_they_are(tmp_path):
    other = dict(SWEBENCH, instance_id="django__django-11099", problem_statement="UsernameValidator allows trailing newline")
    path = write(tmp_path, "lite.jsonl", json.dumps(SWEBENCH) + "\n" + json.dumps(other) + "\n")
    first, second = load_tasks(path).tasks
    assert first.id == "astropy__astropy-12907" and first.text.startswith("Modeling's")
    assert first.swebench and first.fields["FAIL_TO_PASS"] == "[\"t1\"]"
    assert first.metadata["swebench"] == {"repo": "astropy/astropy", "base_commit": SWEBENCH["base_commit"], "version": "4.3"}
    assert second.id == "django__django-11099"


def test_swebench_image_template_and_cwd(tmp_path):
    path = write(tmp_path, "lite.json", json.dumps([SWEBENCH]))
    task_file = load_tasks(path)
    config = load_config({"environment": {"kind": "docker", "image": "swebench/sweb.eval.x86_64.{instance_id}:latest"}})
    [plan] = plan_tasks(task_file, task_file.tasks, config, str(tmp_path / "run"))
    assert plan.config.environment.image == "swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest"
    assert plan.config.environment.cwd == "/testbed" and plan.workspace is None
    bad = load_config({"environment": {"kind": "docker", "image": "img:{nope}"}})
    with pytest.raises(TaskFileError, match=r"index 0 \(id astropy__astropy-12907\).*uses \{nope\}, which the task lacks"):
        plan_tasks(task_file, task_file.tasks, bad, str(tmp_path / "run"))


def test_local_tasks_get_their_own_workspace_and_paths_resolve_next_to_the_task_file(tmp_path):
    os.makedirs(tmp_path / "tasks" / "repo")
    path = write(tmp_path, "tasks/t.yaml", """
- {id: a, task: x, config: {model: {kind: scripted, script: replies/a.yaml}, agent.step_limit: 3}}
- {id: b, task: y, cwd: repo, env: {timeout: 9}}
""")
    task_file = load_tasks(path)
    a, b = plan_tasks(task_file, task_file.tasks, load_config(), str(tmp_path / "run"))
    assert a.config.environment.cwd == a.workspace == str(tmp_path / "run" / "a" / "workspace")
    assert a.config.model.script == str(tmp_path / "tasks" / "replies" / "a.yaml")
    assert a.config.agent.step_limit == 3 and a.trajectory == str(tmp_path / "run" / "a" / "a.traj.json")
    assert b.config.environment.cwd == str(tmp_path / "tasks" / "repo") and b.workspace is None
    assert b.config.environment.timeout == 9.0


@pytest.mark.parametrize(("entry", "message"), [
    ("{id: a, task: x, config: {agent: {step_limt: 3}}}", "line 1 (id a): agent.step_limt: unknown key (did you mean 'step_limit'?)"),
    ("{id: a, task: x, env: {imag: x}}", "environment.imag: unknown key for kind 'local' (did you mean 'image'? image is a docker setting"),
    ("{id: a, task: x, env: {PYTHONPATH: src}}", "variables go under `env: {env: {PYTHONPATH: ...}}`"),
    ("{id: a, task: x, config: {agent: 3}}", "config.agent: expected a section mapping"),
    ("{id: a, task: x, config: {agent.step_limit: -1}}", "agent.step_limit: must be 0 or more"),
    ("{id: a, task: x, cwd: no-such-repo}", "line 1 (id a): cwd: "),
], ids=["config-typo", "env-typo", "env-variable", "config-not-mapping", "negative-limit", "missing-cwd"])
def test_bad_per_task_settings_name_the_task_and_the_fix(tmp_path, entry, message):
    task_file = load_tasks(write(tmp_path, "t.yaml", f"- {entry}\n"))
    with pytest.raises(TaskFileError) as caught:
        plan_tasks(task_file, task_file.tasks, load_config(), str(tmp_path / "run"))
    assert message in str(caught.value) and str(caught.value).startswith(str(tmp_path / "t.yaml"))


@pytest.mark.parametrize(("name", "text", "expected"), [
    ("t.yaml", "- task: no id\n", "t.yaml: line 1: id: missing; add `id: <unique name>`"),
    ("t.yaml", "- id: a\n  task: x\n- id: a\n  task: y\n", "line 3: id 'a' is already used at line 1; ids must be unique"),
    ("t.yaml", "- id: ../etc\n  task: x\n", "id: '../etc' is not safe as a file name; use letters, digits"),
    ("t.yaml", "- id: a\n  task: x\n  evals: make\n", "line 1: evals: unknown field (did you mean 'eval'?)"),
    ("t.yaml", "- id: a\n  task: '  '\n", "task: missing or empty"),
    ("t.yaml", "- id: a\n  task: x\n  setup: [1, 2]\n", "setup: expected a command or a list of commands"),
    ("t.yaml", "- id: a\n  task: x\n  env: [a]\n", "env: expected a mapping"),
    ("t.yaml", "- just a string\n", "line 1: expected a mapping with `id` and `task`, got str"),
    ("t.yaml", "id: a\ntask: x\n", "a task file is a list of tasks"),
    ("t.yaml", "- id: a\n  task: [unclosed\n", "not valid YAML at line"),
    ("t.yaml", "[]\n", "no tasks: the file holds an empty list"),
    ("t.json", '[{"id": "a", "task": "x"}, {"id": "a b", "task": "y"}]', "index 1: id: 'a b' is not safe"),
    ("t.json", '[{"id": "a", ', "not valid JSON"),
    ("t.jsonl", '{"id": "a", "task": "x"}\n{"id": "b", "task": \n', "line 2: not valid JSON"),
    ("lite.jsonl", json.dumps({"instance_id": "x__y-1"}) + "\n", "line 1: problem_statement: missing or empty"),
], ids=["missing-id", "duplicate-id", "unsafe-id", "unknown-field", "empty-task", "setup-type", "env-type",
        "not-mapping", "not-list", "bad-yaml", "empty", "json-index", "bad-json", "bad-jsonl-line", "swebench-no-statement"])
def test_bad_task_files_name_the_place_the_field_and_the_fix(tmp_path, name, text, expected):
    assert expected in problems(tmp_path, name, text)


def test_values_json_cannot_hold_are_refused_at_load_not_in_the_middle_of_the_batch(tmp_path):
    # a date ran the whole batch and failed each task with "Object of type date is not JSON serializable"
    assert "t.yaml: line 1: metadata.created: YAML read datetime.date(2024, 1, 1) as a date; quote it" in problems(
        tmp_path, "t.yaml", "- id: a\n  task: x\n  metadata: {created: 2024-01-01}\n")
    assert "line 1: config.model.temperature: expected a finite number, not nan" in problems(
        tmp_path, "t.jsonl", '{"id": "a", "task": "x", "config": {"model": {"temperature": NaN}}}\n')


def test_a_task_whose_aliases_write_out_to_billions_is_one_line_at_once(tmp_path):
    # nine levels of ten: 10^9 values that every writer of the task (its trajectory, results.jsonl) wrote out
    lines = ["- id: a", "  task: x", "  metadata:", "    l0: &l0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"    l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]" for i in range(1, 9)]
    message = problems(tmp_path, "t.yaml", "\n".join(lines) + "\n")
    assert "t.yaml: line 1: its YAML aliases write out to 1,234,567,903 values, more than 100,000" in message


@pytest.mark.parametrize(("name", "depth"), [("t.yaml", 900), ("t.json", 980), ("t.json", 5000)])
def test_a_task_nested_past_what_python_reads_is_one_line(tmp_path, name, depth):
    # the JSON and YAML readers (and the JSON check) recurse once per level: this was a RecursionError traceback
    nested = "[" * depth + "]" * depth
    text = (f"- id: a\n  task: x\n  metadata: {{d: {nested}}}\n" if name.endswith(".yaml")
            else f'[{{"id": "a", "task": "x", "metadata": {{"d": {nested}}}}}]')
    assert "nested too deeply to read (lists or mappings hundreds of levels down)" in problems(tmp_path, name, text)


def test_every_problem_is_reported_at_once(tmp_path):
    message = problems(tmp_path, "t.yaml", "- {id: a, task: x}\n- {task: y}\n- {id: a, task: z}\n- {id: b}\n")
    assert message.splitlines()[0] == f"{tmp_path / 't.yaml'}: 3 problems in the task file"
    assert "line 2: id: missing" in message and "line 3: id 'a' is already used at line 1" in message
    assert "line 4: task: missing" in message


def test_missing_file(tmp_path):
    with pytest.raises(TaskFileError, match="cannot read task file"):
        load_tasks(str(tmp_path / "nope.yaml"))


def tasks(n):
    path_free = [{"id": f"task-{i:03d}", "task": "x"} for i in range(n)]
    from miniswe.batch.tasks import _task

    return [_task(f"index {i}", e) for i, e in enumerate(path_free)]


def ids(selected):
    return [t.id for t in selected]


def test_filter_slice_and_shuffle_are_deterministic():
    all_tasks = tasks(20)
    assert ids(select_tasks(all_tasks, filter=r"00[1-3]$")) == ["task-001", "task-002", "task-003"]
    assert ids(select_tasks(all_tasks, slice="2:4")) == ["task-002", "task-003"]
    assert ids(select_tasks(all_tasks, slice="18:")) == ["task-018", "task-019"]
    assert ids(select_tasks(all_tasks, slice="3")) == ["task-000", "task-001", "task-002"]
    shuffled = ids(select_tasks(all_tasks, shuffle=True, seed=7))
    assert shuffled == ids(select_tasks(all_tasks, shuffle=True, seed=7)) != ids(all_tasks)
    assert sorted(shuffled) == ids(all_tasks)
    assert shuffled != ids(select_tasks(all_tasks, shuffle=True, seed=8))
    assert ids(select_tasks(all_tasks, shuffle=True, seed=7, slice=":5")) == shuffled[:5]


def test_shards_are_disjoint_cover_the_list_and_ignore_order():
    all_tasks = tasks(50)
    shards = [ids(select_tasks(all_tasks, shard=f"{i}/4")) for i in range(1, 5)]
    assert sorted(sum(shards, [])) == ids(all_tasks)
    assert all(len(shard) > 5 for shard in shards)
    reordered = [ids(select_tasks(list(reversed(all_tasks)), shard=f"{i}/4")) for i in range(1, 5)]
    assert [sorted(s) for s in reordered] == [sorted(s) for s in shards]
    assert all(shard_of(t, 4) == i + 1 for i, shard in enumerate(shards) for t in shard)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"shard": "0/4"}, "--shard '0/4': expected I/N with 1 <= I <= N"),
    ({"shard": "5/4"}, "expected I/N"),
    ({"slice": "a:b"}, "--slice 'a:b': expected START:STOP"),
    ({"filter": "("}, "--filter '(': not a valid regular expression"),
])
def test_bad_selection_flags(kwargs, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace("[", r"\[")):
        select_tasks(tasks(3), **kwargs)


def test_plan_of_a_single_task_keeps_the_batch_config_otherwise(tmp_path):
    [task] = load_tasks(write(tmp_path, "t.yaml", "- {id: a, task: x}\n")).tasks
    base = load_config({"agent": {"step_limit": 11}})
    plan = plan_task(task, base, str(tmp_path / "run"), str(tmp_path))
    assert plan.config.agent == base.agent and plan.config.model == base.model


def test_json_lines_saved_as_json_are_read_as_json_lines(tmp_path):
    path = tmp_path / "swe.json"
    path.write_text(
        '{"instance_id": "a__b-1", "problem_statement": "fix a", "repo": "a/b", "base_commit": "c1"}\n'
        '{"instance_id": "a__b-2", "problem_statement": "fix b", "repo": "a/b", "base_commit": "c2"}\n'
    )
    tasks = load_tasks(str(path)).tasks
    assert [t.id for t in tasks] == ["a__b-1", "a__b-2"]
