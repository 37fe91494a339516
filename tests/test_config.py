"""Config loading: defaults, merge order, typed values, and errors that name the source, key and fix."""

import re

import pytest

from miniswe.config import load_config
from miniswe.errors import ConfigError
from miniswe.models.scripted import load_script


def test_defaults_come_from_the_shipped_yaml():
    config = load_config()
    assert config.agent.step_limit == 100
    assert config.agent.max_format_errors == 3
    assert config.protocol.action_tags == ["mswea_bash_command", "bash"]
    assert config.environment.kind == "local"
    assert config.model.api_key_env == "OPENAI_API_KEY"


def test_files_and_key_values_merge_left_to_right(tmp_path):
    first = tmp_path / "a.yaml"
    first.write_text("agent:\n  step_limit: 5\n  token_limit: 100\nmodel:\n  params: {max_tokens: 10, top_p: 0.5}\n")
    config = load_config(str(first), "agent.step_limit=7", "model.params={max_tokens: 20}", "environment.timeout=2")
    assert config.agent.step_limit == 7
    assert config.agent.token_limit == 100
    assert config.model.params == {"max_tokens": 20, "top_p": 0.5}  # the user's mappings merge key by key
    assert config.environment.timeout == 2.0 and isinstance(config.environment.timeout, float)


def test_key_value_is_read_as_yaml():
    config = load_config("protocol.action_tags=[sh, bash]", "environment.env={A: 1}", "model.name=gpt-4o-mini")
    assert config.protocol.action_tags == ["sh", "bash"]
    assert config.environment.env == {"A": "1"}
    assert config.model.name == "gpt-4o-mini"


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("agent.step_limt=3", "-c agent.step_limt=3: agent.step_limt: unknown key (did you mean 'step_limit'?)"),
        ("agnet.step_limit=3", "agnet: unknown section (did you mean 'agent'?)"),
        ("agent.step_limit=lots", "agent.step_limit: expected a whole number, got a string"),
        ("agent.step_limit=true", "agent.step_limit: expected a whole number, got a boolean"),
        ("environment.timeout=.nan", "environment.timeout: expected a finite number"),
        ("agent.time_limit=.inf", "agent.time_limit: expected a finite number"),
        ("agent.cost_limit=-1", "agent.cost_limit: must be 0 or more (0 = unlimited), got -1.0"),
        # what 0 means is said where it means something, and nothing is claimed where it does not
        ("agent.max_depth=-1", "agent.max_depth: must be 0 or more (0 = no sub-agents), got -1"),
        ("agent.keep_turns=-1", "agent.keep_turns: must be 0 or more, got -1"),
        ("environment.kind=dokcer", "environment.kind: unknown environment 'dokcer' (did you mean 'docker'?)"),
        ("model.prices={input: 1}", "model.prices.input: unknown key"),
        ("protocol.action_tags=[]", "protocol.action_tags: must not be empty"),
        ("protocol.action_tags=[bash, ' ']", "protocol.action_tags[1]: must not be blank, got ' '"),
        ("policy.deny=null", "policy.deny: null is not a list of rules; give a list ([] turns the built-in rules off)"),
        ("agent=5", "agent: expected a mapping"),
        ("agent.step_limit=10000000000000000", "agent.step_limit: 1e+16 is too large (at most 1e+15); use 0 for no limit"),
        ("agent.time_limit=40000000", "agent.time_limit: 4e+07 is too large (at most 3.16224e+07)"),
        ("agent.hooks=[1]", "agent.hooks: expected a list of strings, got a list [1]"),
        ("protocol.file_tools=1", "protocol.file_tools: expected true or false, got int 1"),
        ("protocol.kind=tool", "protocol.kind: unknown value 'tool' (did you mean 'tools'?)"),
        ("protocol.submit_marker=' '", "protocol.submit_marker: must not be empty (default: 'COMPLETE_TASK_AND_SUBMIT"),
        ("policy.confirm=[ok, '*']", "policy.confirm[1]: not a valid regular expression (nothing to repeat"),
        ("model.prices={prompt: -1}", "model.prices.prompt: expected a number of 0 or more, got int -1"),
        ("agent.kind=defualt", "agent.kind: unknown agent 'defualt' (did you mean 'default'?)"),
    ],
)
def test_bad_values_fail_with_key_and_fix(source, message):
    with pytest.raises(ConfigError) as caught:
        load_config(source)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value) and "pydantic" not in str(caught.value) and "Input should" not in str(caught.value)
    assert caught.value.__context__ is None or caught.value.__suppress_context__  # no chained traceback


def test_numbers_are_text_where_text_is_expected_and_nothing_is_empty():
    config = load_config("model.name=4", "agent.templates_dir=null", "agent.hooks=mine:Hook", "environment.env={A: 1, B: null}")
    assert config.model.name == "4" and config.agent.templates_dir == "" and config.agent.hooks == ["mine:Hook"]
    assert config.environment.env == {"A": "1", "B": ""}


def test_file_errors_name_the_file_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("agent:\n  step_limit: 3\n   oops: [\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: not valid YAML at line \d"):
        load_config(str(bad))
    typo = tmp_path / "typo.yaml"
    typo.write_text("model:\n  temprature: 0.2\n")
    with pytest.raises(ConfigError, match=r"typo.yaml: model.temprature: unknown key \(did you mean 'temperature'\?\)"):
        load_config(str(typo))
    with pytest.raises(ConfigError, match="missing.yaml: config file not found"):
        load_config(str(tmp_path / "missing.yaml"))


def default_yaml() -> tuple[dict, dict[tuple[str, str], dict]]:
    """config/default.yaml's live settings, and each other kind's commented block ("# kind: X adds") by (section, kind)."""
    import yaml

    from miniswe.config import default_config_path

    text = open(default_config_path()).read()
    blocks: dict[tuple[str, str], dict] = {}
    section = None
    for match in re.finditer(r"^(\w+):$|^  # kind: (\S+) adds\n((?:  #   .*\n)+)", text, re.M):
        if match[1]:
            section = match[1]
        else:
            body = "".join(line[len("  #   "):] + "\n" for line in match[3].splitlines())
            blocks[(section, match[2])] = yaml.safe_load(body)
    return yaml.safe_load(text), blocks


@pytest.mark.parametrize("value, message", [
    ("{when: 2024-01-01}", r"model.params.when: YAML read datetime.date\(2024, 1, 1\) as a date; quote it"),
    ("{x: [1, .inf]}", r"model.params.x\[1\]: expected a finite number, not inf"),
    ("{x: !!binary aGk=}", r"model.params.x: YAML read b'hi' as a bytes"),
])
def test_what_json_cannot_hold_is_refused_naming_the_key(tmp_path, value, message):
    """A date or NaN would otherwise break the request body and the trajectory's save in the middle of a run."""
    with pytest.raises(ConfigError, match=r"-c model.params=.*: " + message):
        load_config(f"model.params={value}")
    (tmp_path / "dated.yaml").write_text(f"model:\n  params: {value}\n")
    with pytest.raises(ConfigError, match=r"dated.yaml: " + message):
        load_config(str(tmp_path / "dated.yaml"))
    assert load_config("model.params={when: '2024-01-01'}").model.params == {"when": "2024-01-01"}
    with pytest.raises(ConfigError, match=r"model.params.2024-01-01: YAML read the key datetime.date\(2024, 1, 1\)"):
        load_config("model.params={2024-01-01: x}")


def test_yaml_aliases_that_hold_themselves_or_write_out_too_much_are_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"model.params.x\[0\]: holds itself \(a YAML alias inside what it names\)"):
        load_config("model.params={x: &a [*a]}")
    # each level repeats the one before ten times: 10**30 values written out, from a file of 30 lines
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 30)]
    (tmp_path / "laughs.yaml").write_text("model:\n  params:\n" + "".join(f"    {line}\n" for line in lines))
    with pytest.raises(ConfigError, match=r"laughs.yaml: its YAML aliases write out to [\d,]+ values, more than 100,000"):
        load_config(str(tmp_path / "laughs.yaml"))
    # an alias used a few times is fine
    assert load_config("model.params={a: &v [1, 2], b: *v}").model.params == {"a": [1, 2], "b": [1, 2]}


@pytest.mark.parametrize("depth", [900, 5000])
def test_a_config_nested_past_what_python_reads_is_one_line(tmp_path, depth):
    # YAML's reader and the JSON check recurse once per level: this was a RecursionError traceback
    nested = "[" * depth + "]" * depth
    (tmp_path / "deep.yaml").write_text(f"model:\n  params: {{d: {nested}}}\n")
    with pytest.raises(ConfigError, match=r"deep.yaml: nested too deeply to read .*; write it flatter$"):
        load_config(str(tmp_path / "deep.yaml"))
    with pytest.raises(ConfigError, match=r"nested too deeply to read"):
        load_config(f"model.params={{d: {nested}}}")
    (tmp_path / "replies.yaml").write_text(f"- {nested}\n")  # --script FILE
    with pytest.raises(ConfigError, match=r"model.script: .*replies.yaml: nested too deeply to read"):
        load_script(str(tmp_path / "replies.yaml"))


def test_default_yaml_is_the_settings_models_with_a_comment_per_key():
    from miniswe.config import PLUGGABLE, Config, settings_class
    from miniswe.plugins import KINDS

    live, blocks = default_yaml()
    assert live == Config().to_dict(), "default.yaml's values are the settings models' defaults"
    for section, base in PLUGGABLE.items():
        default_kind = getattr(Config(), section).kind
        for kind in KINDS[section]:
            if kind == default_kind:
                continue
            own = set(settings_class(section, kind).model_fields) - set(base.model_fields)
            defaults = settings_class(section, kind)().model_dump()
            # a kind with no keys of its own (agent kind chat) has no block
            assert blocks.get((section, kind), {}) == {k: v for k, v in defaults.items() if k in own}, f"{section} kind {kind}"
    text = open(__import__("miniswe.config", fromlist=["x"]).default_config_path()).read()
    for line in text.splitlines():
        if re.match(r"^  (#   )?\w+: ", line):
            assert "  # " in line.split(":", 1)[1], f"no comment: {line}"


def test_an_image_implies_docker_and_an_image_with_the_local_environment_is_refused():
    # -c environment.image, --image and a task's env.image agree: an image means docker
    assert load_config("environment.image=python:3.12").environment.kind == "docker"
    assert load_config("model.script=r.yaml").model.kind == "scripted"
    with pytest.raises(ConfigError, match=r"environment.image: unknown key for kind 'local' \(image is a docker setting: set environment.kind=docker"):
        load_config("environment.image=python:3.12", "environment.kind=local")


def test_one_key_of_a_mapping_can_be_set_alone(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text("environment:\n  env: {A: a, B: b}\nmodel:\n  params: {max_tokens: 10}\n")
    config = load_config(str(base), "environment.env.C=c", "model.params.top_p=0.5")
    assert config.environment.env == {"A": "a", "B": "b", "C": "c"}
    assert config.model.params == {"max_tokens": 10, "top_p": 0.5}


def test_default_yaml_lists_each_kinds_own_settings_with_their_defaults():
    """The commented `# kind: X adds` blocks are the reference for the other built-in kinds' settings."""
    import yaml

    from miniswe.config import PLUGGABLE, default_config_path, settings_class
    from miniswe.plugins import KINDS

    text = open(default_config_path()).read()
    blocks = re.findall(r"# kind: (\w+) adds\n((?:\s*#   .*\n)+)", text)
    assert {kind for kind, _ in blocks} >= {"docker", "scripted"}
    for kind, block in blocks:
        listed = {}
        for line in block.splitlines():
            key, _, rest = line.strip().removeprefix("#").strip().partition(":")
            value, _, comment = rest.partition("  #")
            assert comment.strip(), f"{kind}: {key} has no comment in default.yaml"
            listed[key] = yaml.safe_load(value)
        section = next(name for name in PLUGGABLE if kind in KINDS[name])
        own = {name: spec.get_default(call_default_factory=True)
               for name, spec in settings_class(section, kind).model_fields.items()
               if name not in PLUGGABLE[section].model_fields}
        assert listed == own, f"default.yaml's `# kind: {kind} adds` block differs from its settings"


CAREFUL = """
from miniswe.config import AgentConfig, Count


class CarefulConfig(AgentConfig):
    patience: Count = 1  # how many times to look before each command


class Careful:
    config_class = CarefulConfig


class Sloppy:
    config_class = dict
"""


def test_an_agent_kind_brings_its_own_settings(tmp_path, monkeypatch):
    (tmp_path / "careful.py").write_text(CAREFUL)
    monkeypatch.syspath_prepend(str(tmp_path))
    config = load_config("agent.kind=careful:Careful", "agent.patience=3", "agent.step_limit=5")
    assert (config.agent.patience, config.agent.step_limit) == (3, 5)
    assert config.to_dict()["agent"]["kind"] == "careful:Careful"
    with pytest.raises(ConfigError, match=r"^-c agent.patienc=3: agent.patienc: unknown key \(did you mean 'patience'\?\)$"):
        load_config("agent.kind=careful:Careful", "agent.patienc=3")
    with pytest.raises(ConfigError, match=r"agent.patience: must be 0 or more"):
        load_config("agent.kind=careful:Careful", "agent.patience=-1")
    with pytest.raises(ConfigError, match=r"agent.kind: careful.Sloppy.config_class must be a pydantic model that "
                                          r"extends miniswe.config.AgentConfig"):
        load_config("agent.kind=careful:Sloppy")


def test_the_config_layer_imports_no_kind_and_no_loop():
    """config.py and plugins.py name kinds by string; the kinds' packages load pydantic only when asked for a base."""
    import subprocess
    import sys

    code = "import sys\nimport miniswe.config\nprint(sorted(m for m in sys.modules if m.startswith('miniswe.')))\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout == "['miniswe.config', 'miniswe.errors', 'miniswe.plugins']\n"
    code = "import sys\nimport miniswe.environments, miniswe.models\nprint('pydantic' in sys.modules)\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout == "False\n"
