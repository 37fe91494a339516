"""The views of `inspect` as terminal text: plain lines when stdout is not a terminal (or NO_COLOR is set),
rich styles and highlighted commands on a terminal, through a pager when the text is longer than the screen."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from typing import Any

from miniswe.environments.images import human
from miniswe.output import visible

LABEL = 10  # width of the header's labels


# -- formatting pieces shared by the plain and the rich text ---------------------------------------------------
def seconds(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.2f}s" if value < 10 else f"{value:.1f}s" if value < 600 else f"{value / 60:.1f}min"


def count(value: int | None) -> str:
    return "—" if value is None else f"{value:,}"


def money(value: float | None) -> str:
    return "—" if value is None else f"${value:.4f}"


def step_marks(step: dict[str, Any]) -> list[str]:
    """How a step ended (its `status`), and how much of its output the capture did not keep."""
    marks = [step["status"]]
    if step["elided_chars"]:
        marks.append(f"{step['elided_chars']:,} bytes not kept")
    if step.get("proposed") is not None:
        marks.append("command changed")
    return marks


def step_title(step: dict[str, Any]) -> str:
    parts = [f"step {step['step']}", *step_marks(step)]
    if not step["format_error"]:
        parts.append(seconds(step["duration_s"]))
    parts.append(f"{count(step['tokens'])} tokens")
    if step["cost"]:
        parts.append(money(step["cost"]))
    return " · ".join(parts)


def child_line(child: dict[str, Any]) -> str:
    """A sub-agent the step ran: how it ended, and where its own trajectory is."""
    return f"↳ sub-agent (depth {child['depth']}): {child['exit_status']}, {child['steps']} steps: {child['trajectory']}"


def step_body(step: dict[str, Any], full: bool) -> tuple[str, str]:
    """(label, text) of what a step shows under its command: the observation, or with --full the stored output."""
    if step.get("pending"):
        return "never finished: the run was killed while this command ran; nothing of its output was recorded", ""
    if full:
        return "output as stored", step["output"]
    if step["observation"] is not None:
        return "", step["observation"]
    return "no observation (the run ended here); output as stored", step["output"]


def header_rows(header: dict[str, Any]) -> list[tuple[str, str]]:
    usage = header["usage"]
    counts = [str(header["steps"])]
    for key, one in (("format_errors", "format error"), ("timeouts", "timeout"), ("nonzero_exits", "non-zero exit"),
                     ("aborted", "aborted")):
        if header[key]:
            counts.append(f"{header[key]} {one}{'s' if header[key] != 1 and key != 'aborted' else ''}")
    exit_line = header["exit_status"] or "unfinished (no exit status yet)"
    if header["exit_detail"]:
        exit_line += " · " + header["exit_detail"].strip().splitlines()[-1][:200]
    if usage["total_tokens"] is None:
        tokens = "not recorded"
    else:
        tokens = f"{usage['total_tokens']:,} (prompt {usage['prompt_tokens']:,} · completion {usage['completion_tokens']:,}"
        tokens += f" · cached {usage['cached_tokens']:,})" if usage["cached_tokens"] else ")"
    tokens += f" · {usage['model_calls']} model calls" + (f", {usage['retries']} retries" if usage["retries"] else "")
    wall = seconds(header["wall_s"])
    if header["started"]:
        wall += f" ({header['started']} → {header['ended'] or 'still running'})"
    rows = [("task", first_lines(header["task"], 3)), ("model", header["model"] or "—"), ("exit", exit_line)]
    if header["resolved"] is not None:
        rows.append(("resolved", "yes" if header["resolved"] else "no"))
    grade = header.get("grade")
    if grade:
        rows.append(("grade", grade_line(grade)))
        for key, tests in (grade.get("tests") or {}).items():
            if tests.get("failure"):
                rows.append((f"{key} failed", first_lines("\n".join(tests["failure"]), 10)))
    rows += [("steps", " · ".join(counts)), ("tokens", tokens), ("cost", "not recorded" if usage["cost"] is None else money(usage["cost"])), ("wall time", wall),
             ("config", " · ".join(f"{k}={v}" for k, v in header["config"].items()) or "—"),
             ("file", f"{header['path']} ({header['source']})")]
    if header.get("parent"):
        parent = header["parent"]
        rows.append(("forked", f"from {parent.get('trajectory')} at step {parent.get('from_step')}"
                     + (f" (run {parent['run_id']})" if parent.get("run_id") else "")))
    for entry in header.get("resumes") or ():
        line = f"at {entry.get('at')} after step {entry.get('from_step')}"
        if entry.get("changes"):
            line += " · changed " + ", ".join(sorted(entry["changes"]))
        if entry.get("diverged"):
            line += f" · replay diverged: {entry['diverged']}"
        rows.append(("resumed", line))
    if header.get("pending") is not None:
        rows.append(("in flight", f"step {header['pending']}: its command never finished (the run was killed); "
                                  "`miniswe run --resume` goes on from there"))
    if header["compactions"]:
        rows.append(("context", "compacted before step " + ", ".join(
            f"{c['step'] + 1} ({c['kind']}, ~{c['tokens_before']:,} → {c['tokens_after']:,} tokens)" for c in header["compactions"])))
    if header["not_recorded"]:
        rows.append(("missing", "; ".join(header["not_recorded"])))
    for note in header["notes"]:
        rows.append(("note", note))
    return rows


def first_lines(text: str, count: int) -> str:
    lines = text.strip().splitlines()
    shown = "\n".join(lines[:count])
    return shown + (f"\n… ({len(lines) - count} more lines)" if len(lines) > count else "")


# -- plain text ----------------------------------------------------------------------------------------------------
def plain_trajectory(view: dict[str, Any], *, full: bool) -> str:
    out: list[str] = []
    for label, value in header_rows(view["header"]):
        out.append(_labelled(label, value))
    for step in view["steps"]:
        out.append("")
        out.append(f"━━ {step_title(step)} " + "━" * 8)
        if step["reasoning"]:
            out.append(_prefixed("~ ", step["reasoning"]))
        if step["thought"]:
            out.append(step["thought"])
        if step.get("proposed") is not None:
            out.append(_prefixed("proposed $ ", step["proposed"], "  "))
            out.append("(changed before it ran; what ran:)")
        if step["command"] is not None:
            out.append(_prefixed("$ ", step["command"], "  "))
        out += [child_line(child) for child in step.get("children") or ()]
        label, body = step_body(step, full)
        if label:
            out.append(f"({label})")
        if body:
            out.append(_prefixed("│ ", body.rstrip("\n")))
    out += _ending(view["header"])
    return visible("\n".join(out) + "\n")


def _ending(header: dict[str, Any]) -> list[str]:
    out = []
    if header["exit_detail"] and "\n" in header["exit_detail"].strip():
        out += ["", "exit detail:", _prefixed("│ ", header["exit_detail"].rstrip("\n"))]
    if header["submission"]:
        out += ["", "submission:", _prefixed("│ ", header["submission"].rstrip("\n"))]
    return out


def _labelled(label: str, value: str) -> str:
    lines = str(value).split("\n")
    return "\n".join([f"{label:<{LABEL}} {lines[0]}"] + [" " * (LABEL + 1) + line for line in lines[1:]])


def _prefixed(first: str, text: str, rest: str | None = None) -> str:
    lines = text.split("\n")
    other = first if rest is None else rest
    return "\n".join([first + lines[0]] + [other + line for line in lines[1:]])


def aligned(rows: list[list[str]], right: set[int]) -> list[list[str]]:
    """The cells padded to their column's width (columns in `right` aligned right)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [[cell.rjust(widths[i]) if i in right else cell.ljust(widths[i]) for i, cell in enumerate(row)] for row in rows]


def plain_table(rows: list[list[str]], right: set[int]) -> str:
    return "\n".join("  ".join(cells).rstrip() for cells in aligned(rows, right))


RUN_HEAD = ["id", "exit status", "resolved", "steps", "tokens", "cost", "wall"]
GRADED_HEAD = ["grading", "tests"]  # after RUN_HEAD when the run was graded


def grade_line(grade: dict[str, Any]) -> str:
    """A SWE-bench grade in one line: status, why, and the grading's own time."""
    detail = (grade.get("detail") or "").strip().splitlines()
    return " · ".join(x for x in (str(grade.get("status")), detail[-1][:200] if detail else "",
                                  f"graded in {seconds(grade.get('wall_s') or 0)}", grade.get("harness") or "") if x)


def run_cells(row: dict[str, Any], graded: bool = False) -> list[str]:
    from miniswe.inspector.views import test_counts

    resolved = {True: "yes", False: "no", None: "—"}[row["resolved"]]
    grade = row.get("grade") or {}
    if grade.get("status") not in (None, "resolved", "unresolved"):
        resolved += f" ({grade['status']})"  # the reason, or why it was not graded
    cells = [visible(row["id"]), visible(row["exit_status"]), resolved, str(row["steps"]), f"{row['tokens']:,}", money(row["cost"]),
             seconds(row["wall_s"])]
    if graded:
        cells += [seconds(grade["wall_s"]) if grade else "—", test_counts(grade) or "—"]
    return cells


def run_table(view: dict[str, Any]) -> list[list[str]]:
    graded = any(row.get("grade") for row in view["rows"])
    return [RUN_HEAD + (GRADED_HEAD if graded else [])] + [run_cells(r, graded) for r in view["rows"]]


def run_summary(view: dict[str, Any]) -> list[str]:
    totals = view["totals"]
    facts = [f"run directory {view['path']}"]
    if view["model"]:
        facts.append(f"model {view['model']}")
    if view["status"]:
        facts.append(f"status {view['status']}")
    counts = [f"{totals['tasks']} tasks" + (f" of {view['selected']} selected" if view["selected"] not in (None, totals["tasks"]) else "")]
    counts += [f"{status} {count}" for status, count in totals["by_status"].items()]
    counts += [f"{label} {totals[key]}" for key, label in (("unfinished", "unfinished"), ("not_run", "not run"))
               if totals.get(key)]
    if totals["evaluated"]:
        counts.append(f"resolved {totals['resolved']} of {totals['evaluated']} ({totals['resolved_rate']:.1%})")
    counts += [f"{totals['tokens']:,} tokens", money(totals["cost"]), f"{seconds(totals['wall_s'])} of task time"]
    if totals.get("graded"):
        counts.append(f"{totals['graded']} graded in {seconds(totals['grade_wall_s'])} (apart from task time)")
    lines = [" · ".join(facts), " · ".join(counts)]
    if totals.get("model_s") or totals.get("image_wait_s") or totals.get("images"):
        time = [f"model calls {seconds(totals['model_s'])} of the task time"]
        if totals.get("image_wait_s"):
            time.append(f"waited {seconds(totals['image_wait_s'])} for images before tasks started (pulls "
                        f"{seconds(totals['pull_wait_s'])}, image budget {seconds(totals['budget_wait_s'])})")
        images = totals.get("images")
        if images:
            budget = f" of {human(images['budget'])}" if images.get("budget") else ""
            time.append(f"{images['pulls']} image(s) pulled, {human(images['bytes_pulled'])} in "
                        f"{seconds(images['pull_s'])}; peak image disk {human(images['peak_disk'])}{budget}")
        lines.append(" · ".join(time))
    return lines


def plain_run(view: dict[str, Any]) -> str:
    lines = run_summary(view) + [""]
    if view["rows"]:
        lines.append(plain_table(run_table(view), right={3, 4, 5, 6, 7}))
    else:
        lines.append("no task matches" if view["totals"]["tasks"] else "no task has finished yet")
    return visible("\n".join(lines) + "\n")


# -- rich, on a terminal ---------------------------------------------------------------------------------------------
def use_rich() -> bool:
    """Styles only for a terminal, and never when NO_COLOR is set (https://no-color.org)."""
    return sys.stdout.isatty() and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"


def _console():
    from rich.console import Console

    width = shutil.get_terminal_size((100, 40)).columns
    return Console(file=io.StringIO(), force_terminal=True, color_system=_color_system_name(), width=width, markup=False,
                   highlight=False, emoji=False, soft_wrap=False)


def _color_system_name() -> str:
    from rich.console import Console

    return Console().color_system or "standard"


class _Painter:
    """ANSI styles by rich style name, line by line (so a pager keeps them), and bash highlighting by pygments.
    Rich's own layout is kept for the header and tables: laying out thousands of steps with it takes seconds."""

    TOKENS = (("Comment", "dim italic"), ("Literal.String", "green"), ("Name.Variable", "cyan"), ("Keyword", "bold magenta"),
              ("Name.Builtin", "bold blue"), ("Operator", "bold"), ("Punctuation", "bold"), ("Literal.Number", "cyan"))

    def __init__(self) -> None:
        from pygments.lexers.shell import BashLexer
        from rich.color import ColorSystem

        systems = {"standard": ColorSystem.STANDARD, "256": ColorSystem.EIGHT_BIT, "truecolor": ColorSystem.TRUECOLOR,
                   "windows": ColorSystem.WINDOWS}
        self.system = systems.get(_color_system_name(), ColorSystem.STANDARD)
        self.lexer = BashLexer()
        self.token_styles: dict[Any, str] = {}

    def __call__(self, text: str, style: str) -> str:
        from rich.style import Style

        text = visible(text)
        if not style or not text:
            return text
        render = Style.parse(style).render
        return "\n".join(render(line, color_system=self.system) if line else line for line in text.split("\n"))

    def bash(self, command: str) -> str:
        out = []
        for token, value in self.lexer.get_tokens(command):
            style = self.token_styles.get(token)
            if style is None:
                style = self.token_styles[token] = next((s for name, s in self.TOKENS if str(token).startswith("Token." + name)), "")
            out.append(self(value, style))
        return "".join(out).rstrip("\n")


def rich_trajectory(view: dict[str, Any], *, full: bool) -> str:
    from rich.cells import cell_len
    from rich.table import Table
    from rich.text import Text

    console = _console()
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="bold cyan", no_wrap=True)
    grid.add_column()
    for label, value in header_rows(view["header"]):
        style = _status_style(view["header"]["exit_status"]) if label == "exit" else "yellow" if label in ("missing", "note", "in flight") else ""
        grid.add_row(label, Text(visible(value), style=style))
    console.print(grid)
    paint = _Painter()
    width = console.width
    out = [console.file.getvalue().rstrip("\n")]
    for step in view["steps"]:
        title = f"━━ {step_title(step)} "
        rule = title + "━" * max(width - cell_len(title), 2)
        out += ["", paint(rule, "bold red" if step["error"] else "bold")]
        if step["reasoning"]:
            out.append(paint(step["reasoning"], "dim italic"))
        if step["thought"]:
            out.append(paint(step["thought"], "italic"))
        if step.get("proposed") is not None:
            out.append(paint("proposed $ ", "dim") + paint(step["proposed"], "dim strike"))
            out.append(paint("(changed before it ran; what ran:)", "dim"))
        if step["command"] is not None:
            shown = step["command"] if step.get("tool") in (None, "bash", "submit") else None
            out.append(paint("$ ", "bold yellow") + (paint.bash(shown) if shown is not None else paint(step["command"], "yellow")))
        out += [paint(child_line(child), "cyan") for child in step.get("children") or ()]
        label, body = step_body(step, full)
        if label:
            out.append(paint(f"({label})", "dim"))
        if body:
            out.append(paint(body.rstrip("\n"), "bright_black" if step["format_error"] else ""))
    for line in _ending(view["header"]):
        out.append(paint(line, "bold") if line.endswith(":") else line)
    return "\n".join(out) + "\n"


def rich_run(view: dict[str, Any]) -> str:
    paint = _Painter()
    lines = [paint(line, "bold") for line in run_summary(view)] + [""]
    if not view["rows"]:
        return "\n".join(lines + ["no task matches" if view["totals"]["tasks"] else "no task has finished yet"]) + "\n"
    table = aligned(run_table(view), right={3, 4, 5, 6, 7})
    lines.append(paint("  ".join(table[0]).rstrip(), "bold cyan"))
    for row, cells in zip(view["rows"], table[1:]):
        cells[1] = paint(cells[1], _status_style(row["exit_status"]))
        cells[2] = paint(cells[2], {True: "green", False: "red"}.get(row["resolved"], "dim"))
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines) + "\n"


def _status_style(status: str | None) -> str:
    from miniswe.status import is_agent_outcome, is_infra_failure

    if status == "Submitted":
        return "bold green"
    if is_infra_failure(status):
        return "bold red"
    return "bold yellow" if is_agent_outcome(status) or status else "dim"


# -- out --------------------------------------------------------------------------------------------------------------
def emit(text: str, *, pager: bool = True) -> None:
    """Write to stdout, through $PAGER (or `less -R`) when stdout is a terminal and the text is longer than it."""
    if pager and sys.stdout.isatty() and text.count("\n") >= shutil.get_terminal_size((80, 24)).lines:
        if _page(text):
            return
    sys.stdout.write(text)
    sys.stdout.flush()


def _page(text: str) -> bool:
    """Show `text` through the pager; False when there is none to use (then the caller prints it)."""
    import shlex

    command = os.environ.get("PAGER", "less -R")
    try:
        program = shlex.split(command)[0] if command.strip() else ""
    except ValueError:
        return False
    if not program or program == "cat" or not shutil.which(program):  # a missing pager must not eat the text
        return False
    env = {**os.environ, "LESS": os.environ.get("LESS", "FRX")}  # as git does: quit on one screen, keep colours
    sys.stdout.flush()
    try:
        pager = subprocess.Popen(command, shell=True, stdin=subprocess.PIPE, env=env)
    except OSError:
        return False
    try:
        pager.stdin.write(text.encode("utf-8", "replace"))
        pager.stdin.close()
    except (BrokenPipeError, OSError):  # the reader quit before the end: that is fine
        pass
    while True:
        try:
            pager.wait()
            return True
        except KeyboardInterrupt:  # Ctrl-C belongs to the pager (less uses it to stop a search)
            continue
