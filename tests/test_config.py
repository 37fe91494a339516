"""Config loading: defaults, merge order, typed values, and errors that name the source, key and fix."""

import pytest

from miniswe.config import load_config
from miniswe.errors import ConfigError


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
        ("agent.cost_limit=-1", "agent.cost_limit: must be 0 or more"),
        ("environment.kind=dokcer", "environment.kind: unknown environment 'dokcer' (did you mean 'docker'?)"),
        ("model.prices={input: 1}", "model.prices.input: unknown key"),
        ("protocol.action_tags=[]", "protocol.action_tags: must not be empty"),
        ("agent=5", "agent: expected a mapping"),
    ],
)
def test_bad_values_fail_with_key_and_fix(source, message):
    with pytest.raises(ConfigError) as caught:
        load_config(source)
    assert message in str(caught.value)


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


def test_default_yaml_documents_every_key():
    import typing
    from dataclasses import fields

    from miniswe.config import Config, default_config_path

    lines = [line.strip() for line in open(default_config_path())]
    for section, cls in typing.get_type_hints(Config).items():
        for key in fields(cls):
            line = next((ln for ln in lines if ln.startswith(f"{key.name}:")), None)
            assert line is not None, f"{section}.{key.name} missing from default.yaml"
            assert "#" in line, f"{section}.{key.name} has no comment in default.yaml"


def test_an_image_with_the_local_environment_is_refused():
    with pytest.raises(ConfigError, match=r"environment.image: unknown key for kind 'local' \(image is a docker setting: set environment.kind=docker"):
        load_config("environment.image=python:3.12")
    assert load_config("environment.image=python:3.12", "environment.kind=docker").environment.kind == "docker"


def test_one_key_of_a_mapping_can_be_set_alone(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text("environment:\n  env: {A: a, B: b}\nmodel:\n  params: {max_tokens: 10}\n")
    config = load_config(str(base), "environment.env.C=c", "model.params.top_p=0.5")
    assert config.environment.env == {"A": "a", "B": "b", "C": "c"}
    assert config.model.params == {"max_tokens": 10, "top_p": 0.5}


def test_default_yaml_lists_each_kinds_own_settings_with_their_defaults():
    """The commented `# kind: X adds` blocks are the reference for the other built-in kinds' settings."""
    import re
    from dataclasses import MISSING, fields

    import yaml

    from miniswe.config import PLUGGABLE, default_config_path

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
        section = next(name for name, (_, _, kinds) in PLUGGABLE.items() if kind in kinds)
        base, config_class, _ = PLUGGABLE[section]
        own = {f.name: (f.default_factory() if f.default is MISSING else f.default)
               for f in fields(config_class(kind)) if f.name not in {b.name for b in fields(base)}}
        assert listed == own, f"default.yaml's `# kind: {kind} adds` block differs from its settings"
