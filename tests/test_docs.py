"""The README and docs/ hold together: a short README with the safety note on its first screen, links and anchors
that lead somewhere, an index of every page, command lines the CLI accepts, and exit codes as status.py has them."""

import re
import shlex

import typer.main
import yaml

from conftest import ROOT
from miniswe.cli import app
from miniswe.status import EXIT_BAD_INPUT, STOP_SIGNALS, ExitStatus, Outcome, run_exit_code, signal_exit_code

README = ROOT / "README.md"
DOCS = ROOT / "docs"
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")


def pages() -> list:
    return [README, *sorted(DOCS.glob("*.md"))]


def prose_and_blocks(text: str) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """The lines outside fenced blocks, and each fenced block as (info string, lines), fences read as CommonMark
    reads them: a block closes at a fence of the same character at least as long, with nothing after it."""
    prose, blocks, open_fence = [], [], None
    for line in text.splitlines():
        match = FENCE.match(line)
        if open_fence is None:
            if match and not (match[1][0] == "`" and "`" in match[2]):
                open_fence = match[1]
                blocks.append((match[2].strip(), []))
            else:
                prose.append(line)
        elif match and match[1][0] == open_fence[0] and len(match[1]) >= len(open_fence) and not match[2].strip():
            open_fence = None
        else:
            blocks[-1][1].append(line)
    return prose, blocks


def without_code_spans(line: str) -> str:
    return re.sub(r"(`+)(.+?)\1", "", line)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text (code spans and links as their text), lower case, punctuation
    other than '-' and '_' dropped, spaces as '-'."""
    text = re.sub(r"(`+)(.+?)\1", r"\2", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path) -> set[str]:
    prose, _ = prose_and_blocks(path.read_text())
    seen: dict[str, int] = {}
    found = set()
    for line in prose:
        match = re.match(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            base = slug(match[1])
            count = seen.get(base, 0)
            found.add(base if count == 0 else f"{base}-{count}")  # GitHub numbers repeated headings
            seen[base] = count + 1
    return found


def links(path) -> list[str]:
    prose, _ = prose_and_blocks(path.read_text())
    return [target for line in prose for target in re.findall(r"\]\(([^)\s]+)\)", without_code_spans(line))]


def test_readme_is_at_most_300_lines():
    lines = README.read_text().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; move detail to a page of docs/"


def test_the_safety_note_is_on_the_first_screen():
    first = " ".join(re.sub(r"^\s*>\s?", "", line) for line in README.read_text().splitlines()[:40])
    first = " ".join(first.split())  # a quote's markers and line breaks out, so a phrase may wrap
    for words in ("runs the model's commands on this machine, as you", "do not trust", "--image",
                  "environment.kind: docker", "no cost limit unless you set one", "--cost-limit", "agent.cost_limit"):
        assert words in first, f"the README's first 40 lines must say {words!r} (the safety note)"
    run = typer.main.get_command(app).commands["run"]
    options = {opt for param in run.params for opt in param.opts}
    assert {"--image", "--cost-limit"} <= options
    defaults = yaml.safe_load((ROOT / "config" / "default.yaml").read_text())
    assert defaults["agent"]["cost_limit"] == 0, "the README says there is no cost limit by default"


def test_every_relative_link_leads_to_a_file_and_heading_that_exist():
    broken = []
    for page in pages():
        for target in links(page):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not ours to check
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}: no file {path}")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file):
                broken.append(f"{page.relative_to(ROOT)}: {target}: no heading #{anchor} in {path or page.name}")
    assert not broken, "\n".join(broken)


def test_the_index_lists_every_page_with_architecture_first():
    listed = [target.partition("#")[0] for target in links(DOCS / "index.md")]
    pages_ = sorted(p.name for p in DOCS.glob("*.md") if p.name != "index.md")
    assert [p for p in pages_ if p not in listed] == [], "docs/index.md must link every page of docs/"
    entries = [line for line in (DOCS / "index.md").read_text().splitlines() if line.startswith("- ")]
    assert entries and "(architecture.md)" in entries[0], "docs/index.md's first entry is architecture.md"
    assert len(entries) == len(set(entries)) >= len(pages_), "one entry per page"


def test_every_page_opens_with_who_it_is_for():
    for page in sorted(DOCS.glob("*.md")):
        lines = [line for line in page.read_text().splitlines() if line.strip()]
        assert lines[0].startswith("# "), f"{page.name} starts with its title"
        assert lines[1].startswith("For "), f"{page.name}: the line after the title says who the page is for"


def command_lines() -> list[tuple[str, str]]:
    """(page, command line) for every `miniswe ...` line of a fenced block (shell or synopsis), continuation lines
    (after a trailing backslash, or indented under a synopsis) joined on; `./dev miniswe` and `./dev demo` too."""
    found = []
    for page in pages():
        _, blocks = prose_and_blocks(page.read_text())
        for info, lines in blocks:
            if info not in ("", "bash", "sh", "console", "shell"):
                continue
            current = None
            for line in lines:
                text = re.sub(r"^\$ ", "", line.rstrip())
                if current is not None and (current.endswith("\\") or (line[:1] == " " and text.strip())):
                    current = current.rstrip("\\") + " " + text.strip()
                    continue
                if current is not None:
                    found.append((page.name, current))
                current = None
                if text.startswith("./dev miniswe "):
                    current = text[len("./dev "):]
                elif text.startswith("./dev demo"):
                    current = "miniswe " + text[len("./dev "):]
                elif text.startswith("miniswe "):
                    current = text
            if current is not None:
                found.append((page.name, current))
    return found


def test_every_command_line_shown_uses_a_real_command_and_real_options():
    commands = typer.main.get_command(app).commands
    shown = command_lines()
    assert len(shown) >= 20 and {"README.md", "cli.md", "replay-and-inspect.md"} <= {page for page, _ in shown}
    for page, line in shown:
        words = shlex.split(line, comments=True)
        name = words[1]
        assert name in commands, f"{page}: `{line}`: miniswe has no command {name!r}"
        real = {opt for param in commands[name].params for opt in [*param.opts, *param.secondary_opts]}
        for word in words[2:]:
            # a synopsis writes [-t|--task-file F]: each spelling between the brackets is an option
            for option in word.lstrip("[").split("|"):
                if re.match(r"^--?[a-zA-Z]", option):
                    option = re.split(r"[=\]]", option)[0]
                    assert option in real, f"{page}: `{line}`: `miniswe {name}` has no option {option}"


def test_the_readme_exit_codes_agree_with_status():
    lines = README.read_text().splitlines()
    header = lines.index("| exit status | meaning | `miniswe run` exit code |")
    table = []
    for line in lines[header + 2:]:
        if not line.startswith("|"):
            break
        table.append([cell.strip() for cell in line.split("|")[1:4]])
    listed = set()
    for statuses, _, code in table:
        names = re.findall(r"`(\w+)`", statuses)
        if not names:
            assert statuses.startswith("(none") and int(code) == EXIT_BAD_INPUT
        for name in names:
            status = ExitStatus(name)
            listed.add(status)
            if status is ExitStatus.INTERRUPTED:
                expected = sorted(signal_exit_code(signal) for signal in STOP_SIGNALS)
                assert [int(c) for c in code.split("/")] == expected
                for signal in STOP_SIGNALS:
                    assert run_exit_code(Outcome(status, signal)) == signal_exit_code(signal)
            else:
                assert run_exit_code(Outcome(status)) == int(code), f"README: {name} exits {code}"
    assert listed == set(ExitStatus), f"README's exit table misses {sorted(set(ExitStatus) - listed)}"


def test_the_architecture_map_names_every_module():
    """A newcomer starts at docs/architecture.md: a module it does not name is one they cannot find their way to."""
    text = (DOCS / "architecture.md").read_text(encoding="utf-8")
    blocks: dict[str, str] = {}  # a package's lines in the map: `models/  openai (...)`, and the lines under it
    package = ""
    for line in text.splitlines():
        found = re.match(r"(\w+)/\s", line)
        package = found.group(1) if found else package if line.startswith(" ") and package else ""
        if package:
            blocks[package] = blocks.get(package, "") + line + "\n"
    missing = []
    for path in sorted((ROOT / "miniswe").rglob("*.py")):
        if path.parent.name == "miniswe":
            named = path.stem in ("__init__", "__main__") or re.search(rf"(?<![\w.]){path.stem}\.py", text)
        else:
            named = re.search(rf"(?<![\w.]){path.stem}(?!\w)", blocks.get(path.parent.name, ""))
        if not named:
            missing.append(str(path.relative_to(ROOT)))
    assert not missing, f"docs/architecture.md does not name: {missing}"
