"""`miniswe inspect`: a recorded run or a batch, in the terminal, as JSON, or as one HTML page; or two compared.

    views.py    the data every output is made from (header and steps of a run, totals and rows of a batch)
    text.py     terminal text: plain, or rich on a terminal; the pager
    compare.py  two trajectories of one task, or two run directories
    page.py     the self-contained HTML page (page.css, page.js)

`inspect` picks the view from what it is given: a file is a trajectory (any format `mini_swe_agent.load_any` reads),
a directory a batch run directory.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass

from miniswe.errors import UsageError


@dataclass(frozen=True)
class InspectOptions:
    step: int | None = None
    steps: str | None = None
    errors: bool = False
    full: bool = False
    json: bool = False
    html: str | None = None
    sort: str | None = None
    status: str | None = None
    pager: bool = True


def inspect_paths(paths: list[str], options: InspectOptions) -> None:
    """Show one trajectory or run directory, or compare two; data to stdout, UsageError for bad input."""
    if not 1 <= len(paths) <= 2:
        raise UsageError("give one trajectory or run directory to inspect, or two to compare")
    for path in paths:
        if not os.path.exists(path):
            raise UsageError(f"{path}: no such file or directory")
    kinds = ["run" if os.path.isdir(p) else "trajectory" for p in paths]
    _check_options(kinds, options)
    if len(paths) == 2:
        return _compare(paths, kinds, options)
    if kinds[0] == "run":
        return _run(paths[0], options)
    return _trajectory(paths[0], options)


def _check_options(kinds: list[str], options: InspectOptions) -> None:
    for_trajectory = [flag for flag, given in (("--step", options.step is not None), ("--steps", options.steps is not None),
                                               ("--errors", options.errors), ("--full", options.full)) if given]
    for_run = [flag for flag, given in (("--sort", options.sort is not None), ("--status", options.status is not None)) if given]
    if len(kinds) == 2:
        given = for_trajectory + for_run + (["--html"] if options.html else [])
        if given:
            raise UsageError(f"{given[0]} does not apply to a comparison of two runs (it takes --json)")
        if kinds[0] != kinds[1]:
            raise UsageError("compare two trajectories or two run directories, not one of each")
    elif kinds[0] == "run" and for_trajectory:
        raise UsageError(f"{for_trajectory[0]} applies to a trajectory; for a run directory use --sort and --status")
    elif kinds[0] == "trajectory" and for_run:
        raise UsageError(f"{for_run[0]} applies to a run directory; for a trajectory use --step, --steps and --errors")
    if options.json and options.html:
        raise UsageError("give --json or --html, not both")


def _trajectory(path: str, options: InspectOptions) -> None:
    from miniswe.mini_swe_agent import load_any
    from miniswe.inspector import views

    trajectory = load_any(path)
    if options.html:
        from miniswe.inspector.page import trajectory_page

        return _write_html(options.html, trajectory_page(trajectory), f"{len(trajectory.steps)} steps")
    select = views.select_steps(options.step, options.steps, options.errors)
    view = views.trajectory_view(trajectory, select=select)
    if options.step is not None and not view["steps"]:
        raise UsageError(f"--step {options.step}: the run has steps 1 to {len(trajectory.steps)}" if trajectory.steps
                         else f"--step {options.step}: the run has no steps")
    if options.json:
        return _print_json(view)
    from miniswe.inspector import text

    rendered = text.rich_trajectory(view, full=options.full) if text.use_rich() else text.plain_trajectory(view, full=options.full)
    text.emit(rendered, pager=options.pager)


def _run(path: str, options: InspectOptions) -> None:
    from miniswe.inspector import views

    if options.html:
        from miniswe.inspector.page import batch_page

        return _write_html(options.html, batch_page(path), "")
    view = views.run_view(path, sort=options.sort, status=options.status)
    if options.json:
        return _print_json(view)
    from miniswe.inspector import text

    text.emit(text.rich_run(view) if text.use_rich() else text.plain_run(view), pager=options.pager)


def _compare(paths: list[str], kinds: list[str], options: InspectOptions) -> None:
    from miniswe.inspector import compare

    if kinds[0] == "run":
        view = compare.compare_runs(*paths)
        rendered = compare.runs_text(view)
    else:
        from miniswe.mini_swe_agent import load_any

        view = compare.compare_trajectories(load_any(paths[0]), load_any(paths[1]))
        rendered = compare.trajectories_text(view)
        if not view["same_task"] and options.json:  # the text says so itself
            print("miniswe: warning: the two trajectories are of different tasks", file=sys.stderr)
    if options.json:
        return _print_json(view)
    from miniswe.inspector import text

    text.emit(rendered, pager=options.pager)


def _print_json(view: dict) -> None:
    sys.stdout.write(json.dumps(view, indent=2, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def _write_html(path: str, page: str, what: str) -> None:
    from miniswe.inspector.page import write_page

    if os.path.isdir(path):
        raise UsageError(f"--html {path}: is a directory; give a file path such as {os.path.join(path, 'run.html')}")
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)  # a page into a new folder: made, as `-o` does for a trajectory
    except OSError as error:
        raise UsageError(f"--html {path}: cannot create its folder {folder}: {error.strerror or error}") from None
    size = write_page(path, page)
    shown = f"{size / 1e6:.1f} MB" if size >= 1e6 else f"{size / 1e3:.0f} KB"
    print(f"miniswe: wrote {path} ({shown}{', ' + what if what else ''}); open it in a browser", file=sys.stderr)
    print(os.path.abspath(path))
