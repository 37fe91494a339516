"""The README's CLI reference and config keys match what the program really accepts."""

import re

import typer.main

from conftest import ROOT
from miniswe.cli import app


def readme() -> str:
    return (ROOT / "README.md").read_text()


def usage_blocks() -> dict[str, str]:
    """`miniswe CMD ...` synopses from the README's code blocks, by command."""
    found: dict[str, str] = {}
    for block in re.findall(r"```\n(miniswe .*?)```", readme(), re.S):
        for synopsis in re.split(r"\n(?=miniswe )", block.strip()):
            command = synopsis.split()[1]
            found[command] = synopsis
    return found


def test_every_command_is_documented_with_exactly_its_options():
    group = typer.main.get_command(app)
    documented = usage_blocks()
    assert sorted(documented) == sorted(group.commands), "README synopses and CLI commands differ"
    for name, command in group.commands.items():
        real = {opt for param in command.params for opt in param.opts if opt.startswith("-") and opt != "--help"}
        shown = set(re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", documented[name]))
        # a synopsis shows one spelling of each option; every shown one must exist, every option must be shown
        assert shown <= real, f"README shows options `miniswe {name}` does not have: {sorted(shown - real)}"
        for param in command.params:
            opts = [o for o in param.opts if o.startswith("-")]
            if opts and opts != ["--help"]:
                assert set(opts) & shown, f"`miniswe {name}` option {opts} is missing from the README"


def test_every_config_key_is_in_the_readme_table():
    import typing
    from dataclasses import fields

    from miniswe.config import Config

    text = readme()
    for section, cls in typing.get_type_hints(Config).items():
        row = next(line for line in text.splitlines() if line.startswith(f"| `{section}` |"))
        for key in fields(cls):
            assert f"`{key.name}`" in row, f"{section}.{key.name} missing from the README's config table"
