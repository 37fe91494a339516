"""The docs' CLI reference (docs/cli.md) and config key table (docs/configuration.md) match what the program
really accepts."""

import re

import typer.main

from conftest import ROOT
from miniswe.cli import app


def doc(name: str) -> str:
    return (ROOT / "docs" / name).read_text()


def usage_blocks() -> dict[str, str]:
    """`miniswe CMD ...` synopses from the CLI reference's code blocks, by command."""
    found: dict[str, str] = {}
    for block in re.findall(r"```\n(miniswe .*?)```", doc("cli.md"), re.S):
        for synopsis in re.split(r"\n(?=miniswe )", block.strip()):
            command = synopsis.split()[1]
            found[command] = found.get(command, "") + "\n" + synopsis  # a command may have several forms
    return found


def test_every_command_is_documented_with_exactly_its_options():
    group = typer.main.get_command(app)
    documented = usage_blocks()
    assert sorted(documented) == sorted(group.commands), "docs/cli.md synopses and CLI commands differ"
    for name, command in group.commands.items():
        real = {opt for param in command.params for opt in [*param.opts, *param.secondary_opts] if opt.startswith("-") and opt != "--help"}
        shown = set(re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", documented[name]))
        # a synopsis shows one spelling of each option; every shown one must exist, every option must be shown
        assert shown <= real, f"docs/cli.md shows options `miniswe {name}` does not have: {sorted(shown - real)}"
        for param in command.params:
            opts = [o for o in param.opts if o.startswith("-")]
            if opts and opts != ["--help"]:
                assert set(opts) & shown, f"`miniswe {name}` option {opts} is missing from docs/cli.md"


def test_every_config_key_is_in_the_configuration_table():
    from miniswe.config import FIXED, PLUGGABLE, settings_class
    from miniswe.plugins import KINDS

    rows = {tuple(cell.strip(" `") for cell in line.split("|")[1:3]): line
            for line in doc("configuration.md").splitlines() if line.startswith("| `") and line.count("|") == 4}
    for section, cls in FIXED.items():
        for key in cls.model_fields:
            assert f"`{key}`" in rows[(section, "")], f"{section}.{key} missing from docs/configuration.md's key table"
    for section, base in PLUGGABLE.items():
        shared = set(base.model_fields)
        # a section whose built-in kinds add no keys has one row for all of them
        row = rows.get((section, "every kind")) or rows[(section, "")]
        for key in shared:
            assert f"`{key}`" in row, f"{section}.{key} missing from docs/configuration.md's key table"
        for kind in KINDS[section]:
            own = [name for name in settings_class(section, kind).model_fields if name not in shared]
            for key in own:
                assert f"`{key}`" in rows[(section, kind)], f"{section}.{key} ({kind}) missing from docs/configuration.md's key table"
