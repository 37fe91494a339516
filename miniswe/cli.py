"""The command line. Thin: each command imports what it runs, so `miniswe --help` loads typer only."""

from __future__ import annotations

import copy
import os
import sys
from typing import Annotated, NoReturn, Optional

import typer

from miniswe.help_cache import HelpRequest
from miniswe.flags import BATCH_FLAGS, RUN_FLAGS, ConfigOpt, resolve_config, with_flags
from miniswe.output import guard_streams, visible

app = typer.Typer(
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    add_completion=False,
    rich_markup_mode=None,
    help="miniswe: a small coding agent that runs one shell command per model reply.",
)

QuietOpt = Annotated[bool, typer.Option("-q", "--quiet", help="Print only the final line.")]


def fail(error: Exception) -> NoReturn:
    """One line on stderr, then the exit code of the error's class."""
    from miniswe.status import error_exit_code

    print(f"miniswe: {visible(str(error))}", file=sys.stderr)  # a server's message is not trusted with the terminal
    raise typer.Exit(error_exit_code(error))


def _read_task(task: str | None, task_file: str | None) -> str:
    from miniswe.errors import UsageError

    if task_file:
        try:
            with open(task_file, encoding="utf-8") as handle:
                task = handle.read()
        except OSError as error:
            raise UsageError(f"--task-file {task_file}: {error.strerror}") from None
        except UnicodeDecodeError:
            raise UsageError(f"--task-file {task_file}: not UTF-8 text; save the task as UTF-8") from None
    if not task or not task.strip():
        raise UsageError("no task given: pass the task text as an argument or --task-file FILE")
    return task


@app.command()
@with_flags(*RUN_FLAGS)
def run(
    task: Annotated[Optional[str], typer.Argument(help="The task text (or use --task-file).")] = None,
    task_file: Annotated[Optional[str], typer.Option("--task-file", "-t", help="Read the task text from a file.")] = None,
    config: ConfigOpt = [],
    output: Annotated[Optional[str], typer.Option("-o", "--output", help="Trajectory path (default: trajectories/<run id>-<task>.traj.json).")] = None,
    resume: Annotated[Optional[str], typer.Option("--resume", metavar="TRAJ", help="Go on with a run that ended without a verdict, in its own file.")] = None,
    fork: Annotated[Optional[str], typer.Option("--fork", metavar="TRAJ", help="Go on with a copy of a run from --from-step N, into -o NEW.")] = None,
    from_step: Annotated[Optional[int], typer.Option("--from-step", metavar="N", help="With --fork: how many of its steps the fork keeps.")] = None,
    force: Annotated[bool, typer.Option("--force", help="With --resume/--fork: go on even if the fresh environment does not replay the recording.")] = False,
    sub: Annotated[bool, typer.Option("--sub", help="From a command of a run: have that run start a sub-agent on TASK, and print how it ended.")] = False,
    quiet: QuietOpt = False,
    *,
    flags: dict,
) -> None:
    """Solve one task, showing each step; or go on with a recorded run (--resume, --fork).

    Steps go to stderr, the final line to stdout. Exit codes: 0 submitted, 1 stopped without submitting,
    2 bad input, 3 infrastructure failure, 129/130/143 interrupted (SIGHUP/SIGINT/SIGTERM).
    """
    from miniswe.errors import MinisweError, UsageError

    if sub:
        try:
            code = _run_sub(task, task_file, flags, config=config, output=output, resume=resume, fork=fork,
                            from_step=from_step, force=force)
        except MinisweError as error:
            fail(error)
        raise typer.Exit(code)
    try:
        from miniswe.display import make_display, summary_line
        from miniswe.signals import SignalHandlers, Stop

        display = make_display(quiet)
        stop = Stop()
        services = {"stop": stop, "hooks": [display], "notify": display.notice}
        if resume or fork:
            if task or task_file:
                raise UsageError("--resume and --fork go on with the recorded task: give no task text")
            if resume and fork:
                raise UsageError("--resume TRAJ goes on in TRAJ, --fork TRAJ in a copy: give one of them")
            if resume and (output or from_step is not None):
                # a resume goes on in the recorded file itself, from its last step; -o or --from-step would be ignored
                given = "-o" if output else "--from-step"
                raise UsageError(f"--resume {resume} goes on in that file from its last step: give no {given} "
                                 "(--fork TRAJ --from-step N -o NEW goes on in a copy)")
            from miniswe import resume as resuming

            services["on_check"] = lambda checked: display.notice(_checked_line(checked))

            def configure(recorded: dict):
                return resolve_config(config, flags, base=recorded, recorded_in=resume or fork)

            with SignalHandlers(stop, first_urgent=True):
                result = (resuming.resume(resume, configure, force=force, **services) if resume else
                          resuming.fork_run(fork, from_step, output, configure, force=force, **services))
            if result.diverged:
                print(f"miniswe: stopped: the fresh environment does not replay the recording at {result.diverged}; "
                      "pass --force to go on anyway", file=sys.stderr)
                if result.diverged.diff:
                    print(visible(result.diverged.diff), file=sys.stderr)
                from miniswe.status import EXIT_INFRA

                raise typer.Exit(EXIT_INFRA)
        else:
            result = _run_new(_read_task(task, task_file), config, flags, output, stop, services)
    except MinisweError as error:
        fail(error)
    _report_end(result, display, summary_line)


SUB_LIMITS = ("step_limit", "token_limit", "cost_limit", "time_limit")


def _run_sub(task: str | None, task_file: str | None, flags: dict, **others) -> int:
    """`miniswe run --sub`: ask the run this command belongs to for a sub-agent; print its answer."""
    from miniswe.errors import UsageError
    from miniswe.subagents import request

    # a bool flag not given is False, not None
    given = [name for name, value in others.items() if value] + [
        name for name, value in flags.items() if value is not None and value is not False and name not in SUB_LIMITS]
    if given:
        raise UsageError(f"--sub runs with the settings of the run that asks: give it only the task (and smaller "
                         f"limits), not --{given[0].replace('_', '-')}")
    text, code = request(_read_task(task, task_file), {name: flags[name] for name in SUB_LIMITS if flags[name]})
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    sys.stdout.flush()
    return code


def _checked_line(checked) -> str:
    verdict = f"differs: {checked.divergence.what}" if checked.divergence else "matches"
    return f"replayed {checked.where}: {verdict}" + (f" ({checked.note})" if checked.note else "")


def _run_new(task: str, config: list[str], flags: dict, output: str | None, stop, services: dict):
    """A new run of `task`: its config checked, then run with signals turned into a stop."""
    from miniswe.errors import UsageError
    from miniswe.runner import run_task
    from miniswe.trajectory import default_trajectory_path, new_run_id
    from miniswe.signals import SignalHandlers

    cfg, renderer = _ready_config(config, flags, task)
    run_id = new_run_id()
    path = output or default_trajectory_path(task, run_id)
    if os.path.isdir(path):
        raise UsageError(f"-o {path}: is a directory; give a file path such as {os.path.join(path, 'run.traj.json')}")
    with SignalHandlers(stop, first_urgent=True):
        return run_task(cfg, task, path, run_id=run_id, renderer=renderer, **services)


def _ready_config(config: list[str], flags: dict, task: str = ""):
    """The config of a run or a chat, checked ready to start: (config, renderer)."""
    from miniswe.errors import UsageError
    from miniswe.runner import check_ready

    cfg = resolve_config(config, flags)
    cwd = cfg.environment.cwd
    if cfg.environment.kind == "local" and cwd and not os.path.isdir(cwd):
        where = f"--cwd {cwd}" if flags["cwd"] else f"environment.cwd: {cwd}"
        raise UsageError(f"{where}: no such directory; create it or give an existing one")
    renderer = check_ready(cfg, task)
    _warn_orphans(cfg)
    return cfg, renderer


def _report_end(result, display, summary_line) -> NoReturn:
    """The run's end: one line on stderr for a run that did not submit, the summary line on stdout, the exit code."""
    from miniswe.status import ExitStatus, run_exit_code

    outcome = result.outcome
    last = (outcome.detail or "").strip().splitlines()[-1:] or [""]
    if outcome.status is ExitStatus.ERROR:
        print(f"miniswe: internal error (traceback saved in {result.trajectory.path}): {visible(last[0])}", file=sys.stderr)
    elif outcome.status is not ExitStatus.SUBMITTED and outcome.detail:
        print(f"miniswe: {outcome.status}: {visible(last[0])}", file=sys.stderr)
    display.final(summary_line(result.trajectory, result.resolved))
    raise typer.Exit(run_exit_code(outcome))


@app.command()
@with_flags(*RUN_FLAGS)
def chat(
    config: ConfigOpt = [],
    mode: Annotated[str, typer.Option("--mode", metavar="confirm|yolo|human", help="confirm: approve each command (default); yolo: run them unattended; human: type the commands yourself. /mode switches.")] = "confirm",
    *,
    flags: dict,
) -> None:
    """Work with the agent at a terminal: each message is a task, the conversation goes on.

    Approve, refuse or edit commands (--mode), save and load sessions (/save, /list, /load), /help for the rest.
    Sessions live in ~/.miniswe (or $MINISWE_HOME). Exit codes: 0 left normally, 2 bad input, 3 the environment
    or model could not start, 129/143 ended by SIGHUP/SIGTERM.
    """
    from miniswe.errors import MinisweError, UsageError

    try:
        from miniswe.chat.approval import MODES

        if mode not in MODES:
            raise UsageError(f"--mode {mode}: choose one of {', '.join(MODES)}")
        cfg, renderer = _ready_config(config, flags)
        from miniswe.chat.repl import chat as run_chat

        code = run_chat(cfg, mode, renderer)
    except MinisweError as error:
        fail(error)
    raise typer.Exit(code)


@app.command()
@with_flags(*BATCH_FLAGS)
def batch(
    tasks: Annotated[str, typer.Argument(help="Task file (YAML/JSON/JSONL/Parquet, SWE-bench instances too) or a dataset: verified, lite, full, multimodal, multilingual, or a Hugging Face id.")],
    output: Annotated[Optional[str], typer.Option("-o", "--output", help="Run directory (default: trajectories/<task file name>).")] = None,
    workers: Annotated[int, typer.Option("-w", "--workers", help="Tasks run in parallel.")] = 1,
    config: ConfigOpt = [],
    filter: Annotated[Optional[str], typer.Option("--filter", help="Run only tasks whose id matches this regex.")] = None,
    slice: Annotated[Optional[str], typer.Option("--slice", help="Run tasks START:STOP of the (filtered, shuffled) list.")] = None,
    shuffle: Annotated[bool, typer.Option("--shuffle", help="Shuffle the tasks (deterministic, see --seed).")] = False,
    seed: Annotated[Optional[int], typer.Option("--seed", help="Seed of --shuffle (default 0).")] = None,
    shard: Annotated[Optional[str], typer.Option("--shard", help="Run shard I of N (I/N, by hash of the task id).")] = None,
    redo: Annotated[Optional[str], typer.Option("--redo", help="Also rerun finished tasks: failed (not resolved/submitted), all, or ID,ID.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Continue into a run directory of another task file or model.")] = False,
    max_concurrent_calls: Annotated[int, typer.Option("--max-concurrent-calls", help="Model calls in flight at once (0 = one per worker).")] = 0,
    batch_cost_limit: Annotated[float, typer.Option("--batch-cost-limit", help="USD for the whole batch; then no new task starts and running ones stop (0 = unlimited).")] = 0.0,
    batch_token_limit: Annotated[int, typer.Option("--batch-token-limit", help="Tokens for the whole batch, like --batch-cost-limit (0 = unlimited).")] = 0,
    quiet: Annotated[bool, typer.Option("-q", "--quiet", help="No progress; print one summary line instead of the report.")] = False,
    executor: Annotated[str, typer.Option("--executor", help="Where tasks run: threads (this process) or ray (a Ray cluster's nodes).")] = "threads",
    ray_address: Annotated[Optional[str], typer.Option("--ray-address", help="Ray cluster to use (host:port or auto); default: a private one on this machine.")] = None,
    ray_resources: Annotated[Optional[str], typer.Option("--ray-resources", help="What each task asks of a Ray node, e.g. docker=1 or CPU=0.5 (default CPU=1).")] = None,
    split: Annotated[str, typer.Option("--split", help="The split of a dataset given by name.")] = "test",
    grade: Annotated[Optional[bool], typer.Option("--grade/--no-grade", help="Grade SWE-bench submissions by the official harness (default: when it is installed).")] = None,
    grade_timeout: Annotated[float, typer.Option("--grade-timeout", help="Seconds for one instance's eval script.")] = 1800.0,
    image_budget: Annotated[Optional[str], typer.Option("--image-budget", help="Disk the images this batch pulls may take on each machine, e.g. 50G; those no queued or running task needs are removed, least recently used first (default: no budget).")] = None,
    prefetch: Annotated[Optional[int], typer.Option("--prefetch", help="Images of queued tasks to pull while workers run (default: one per worker, at least 2; 0: each when its task starts).")] = None,
    max_pulls: Annotated[int, typer.Option("--max-pulls", help="Image pulls at once on each machine.")] = 2,
    pull_tries: Annotated[int, typer.Option("--pull-tries", help="Tries of a failing pull before its task ends as PullError.")] = 5,
    pull_backoff: Annotated[float, typer.Option("--pull-backoff", help="Seconds before a failed pull is tried again, doubling; a rate limit pauses every pull from that registry.")] = 5.0,
    *,
    flags: dict,
) -> None:
    """Run a task list in parallel, resumably.

    Exit codes: 0 every task ended by the agent, 1 a batch budget stopped the batch before every task ran (run it
    again to run them), 2 bad input, 3 infrastructure failures, 129/130/143 interrupted.
    """
    from miniswe.errors import MinisweError

    try:
        from miniswe.batch.run import BatchOptions, default_run_dir
        from miniswe.batch.evaluate import batch_sources

        cfg = resolve_config([*batch_sources(tasks), *config], flags)  # SWE-bench lists: the shipped benchmark config first
        options = BatchOptions(
            tasks, output, workers=workers, filter=filter, slice=slice, shuffle=shuffle, seed=seed, shard=shard,
            redo=redo, force=force, max_concurrent_calls=max_concurrent_calls, batch_cost_limit=batch_cost_limit,
            batch_token_limit=batch_token_limit, quiet=quiet, executor=executor, ray_address=ray_address,
            ray_resources=ray_resources, split=split, grade=grade, grade_timeout=grade_timeout,
            image_budget=image_budget, prefetch=prefetch, max_pulls=max_pulls, pull_tries=pull_tries,
            pull_backoff=pull_backoff,
            command=_rerun_command("batch", output, default_run_dir(tasks, shard, split), fallback=[tasks]),
        )
        _run_batch(cfg, options)
    except MinisweError as error:
        fail(error)


@app.command()
@with_flags("image", "env", "debug")
def images(
    tasks: Annotated[str, typer.Argument(help="Task file or dataset, as for `miniswe batch`.")],
    config: ConfigOpt = [],
    filter: Annotated[Optional[str], typer.Option("--filter", help="Only tasks whose id matches this regex.")] = None,
    slice: Annotated[Optional[str], typer.Option("--slice", help="Tasks START:STOP of the (filtered) list.")] = None,
    shard: Annotated[Optional[str], typer.Option("--shard", help="Shard I of N (I/N).")] = None,
    split: Annotated[str, typer.Option("--split", help="The split of a dataset given by name.")] = "test",
    max_pulls: Annotated[int, typer.Option("--max-pulls", help="Pulls at once.")] = 2,
    *,
    flags: dict,
) -> None:
    """Pull every image a task list needs, once, before many runs (a batch never removes images that were there before it).

    Exit codes: 0 every image is there, 2 bad input, 3 some could not be pulled (run it again to retry them).
    """
    from miniswe.errors import MinisweError

    try:
        from miniswe.batch.evaluate import batch_sources
        from miniswe.batch.prepull import prepull

        cfg = resolve_config([*batch_sources(tasks), *config], flags)
        code = prepull(tasks, cfg, split=split, filter=filter, slice=slice, shard=shard, max_pulls=max_pulls)
    except MinisweError as error:
        fail(error)
    raise typer.Exit(code)


@app.command()
def evaluate(
    run_dir: Annotated[str, typer.Argument(help="A run directory of `miniswe batch` over SWE-bench instances.")],
    tasks: Annotated[Optional[str], typer.Option("--tasks", help="The instances the batch ran (default: the list run.json names).")] = None,
    split: Annotated[Optional[str], typer.Option("--split", help="The dataset's split (default: the batch's).")] = None,
    workers: Annotated[int, typer.Option("-w", "--workers", help="Tasks graded in parallel.")] = 1,
    regrade: Annotated[bool, typer.Option("--regrade", help="Grade every submitted task again, not only ungraded ones.")] = False,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds for one instance's eval script.")] = 1800.0,
    quiet: QuietOpt = False,
) -> None:
    """Grade, or regrade, a finished batch by the official SWE-bench harness's rules.

    Exit codes: 0 graded, 3 some task could not be graded (image, engine), 2 bad input, 129/130/143 interrupted.
    """
    from miniswe.errors import MinisweError

    try:
        from miniswe.batch.evaluate import evaluate as grade_run

        result = grade_run(run_dir, tasks=tasks, split=split, workers=workers, regrade=regrade, timeout=timeout,
                           quiet=quiet, command=_rerun_command("evaluate", run_dir, run_dir))
    except MinisweError as error:
        fail(error)
    print(visible(result.markdown), flush=True)
    raise typer.Exit(result.exit_code)


@app.command()
def replay(
    trajectory: Annotated[str, typer.Argument(help="A trajectory to run again.")],
    config: ConfigOpt = [],
    cwd: Annotated[Optional[str], typer.Option("--cwd", metavar="DIR", help="Replay in this directory (a local run; default: the recorded one).")] = None,
    until: Annotated[Optional[int], typer.Option("--until", metavar="N", help="Stop after step N.")] = None,
    mask: Annotated[list[str], typer.Option("--mask", metavar="REGEX", help="Also mask output matching this before comparing; repeatable.")] = [],
    quiet: Annotated[bool, typer.Option("-q", "--quiet", help="Print only the verdict.")] = False,
) -> None:
    """Run a recorded run's commands again, without the model, and say where the outputs diverge.

    Exit codes: 0 every command gave its recorded output (a step the recording cut short runs again, its output
    not compared), 1 a divergence or a replay that could not check every step, 2 bad input, 3 the environment failed.
    """
    from miniswe.errors import MinisweError, UsageError

    held = None
    try:
        if until is not None and until < 1:
            raise UsageError(f"--until {until}: steps are numbered from 1; give 1 or more (without --until every "
                             "step is checked)")
        from miniswe.output import add_secrets
        from miniswe.redaction import restore_secrets, run_secrets
        from miniswe.replay import replay_recording
        from miniswe.mini_swe_agent import load_any
        from miniswe.signals import SignalHandlers, Stop
        from miniswe.trajectory import claim_file

        # one process at a time: not beside the run itself, a resume of it, or another replay (see trajectory.py)
        held = claim_file(trajectory)
        recording = load_any(trajectory)  # the reference implementation's runs replay too
        cfg = resolve_config(config, {"cwd": cwd}, base=restore_secrets(recording.config), recorded_in=trajectory)
        from miniswe.runner import check_unmasked

        check_unmasked(cfg)  # commands must not run with the mask as a secret's value
        if mask:
            from miniswe.config import override

            cfg = override(cfg, replay={"masks": [*cfg.replay.masks, *mask]})
        secrets = run_secrets(cfg)
        add_secrets(secrets)
        if cfg.environment.kind == "local":
            # where the recorded run worked, if it worked here: a container's directory means nothing on this host
            ran = recording.environment.get("kind")
            recorded = cfg.environment.cwd or (recording.environment.get("cwd") if ran == "local" else None)
            if not recorded:
                why = "names no working directory" if ran in ("local", None, "unknown") else \
                    f"ran elsewhere ({ran}), so it names no local working directory"
                raise UsageError(f"{trajectory}: the recording {why}, and its commands would run here; pass --cwd DIR "
                                 "(a fresh copy of the repository, say) or -c environment.cwd=DIR")
            where = os.path.abspath(recorded)
            cfg = override_cwd(cfg, where)
            print(f"miniswe: replaying in {where}: {_what_is_there(where, given=bool(cwd))}", file=sys.stderr)
        stop = Stop()
        skipped: list[str] = []  # steps ran again without their output compared
        ended: list[str] = []  # where the replay ended before the recording did

        def progress(checked) -> None:
            if not checked.compared:
                (ended if checked.ends else skipped).append(checked.where)
            if not quiet:
                print(f"miniswe: {visible(_checked_line(checked))}", file=sys.stderr, flush=True)

        with SignalHandlers(stop, first_urgent=True) as signals:
            count, divergence = replay_recording(recording, cfg, until=until, stop=stop, on_check=progress,
                                                 scrub=secrets.scrub)
    except MinisweError as error:
        fail(error)
    finally:
        if held is not None:
            held.release()
    from miniswe.status import EXIT_DIVERGED, signal_exit_code

    if signals.signal_name:
        raise typer.Exit(signal_exit_code(signals.signal_name))
    if divergence:
        print(visible(f"diverged at {divergence}" + (f"\n{divergence.diff}" if divergence.diff else "")), flush=True)
        raise typer.Exit(EXIT_DIVERGED)
    if ended:
        print(f"incomplete: {count} command(s) gave their recorded output, but the replay stopped at {ended[0]} "
              "(it ran a sub-agent, whose model calls are not made again); the steps after it were not checked", flush=True)
        raise typer.Exit(EXIT_DIVERGED)
    unchecked = f"; {', '.join(skipped)} cut short in the recording: ran again, output not compared" if skipped else ""
    print(f"matched: {count} command(s) gave their recorded output{unchecked}", flush=True)


def _what_is_there(where: str, *, given: bool) -> str:
    """The replay directory's notice: what a replay there starts from."""
    try:
        entries = [name for name in os.listdir(where) if name != ".git"]
    except OSError:
        return "it does not exist yet"
    if not entries:
        return "empty" + ("; the setup and the commands build everything again" if given else "")
    if given:
        return f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'} there already: the replay starts from them"
    return ("the recorded directory, with whatever the original run left there (--cwd DIR replays in another "
            "directory, a fresh checkout say)")


def override_cwd(cfg, cwd: str):
    from miniswe.config import override

    return override(cfg, environment={"cwd": cwd})


@app.command()
def report(
    run_dir: Annotated[str, typer.Argument(help="A run directory of `miniswe batch` or `miniswe merge`.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the numbers as JSON.")] = False,
) -> None:
    """Summarise a batch run.

    Outcomes, resolved rate, steps/tokens/cost/time, failures and how to rerun them.
    """
    import json

    from miniswe.batch.report import build_report, load_run, render_markdown
    from miniswe.errors import MinisweError

    try:
        records, run = load_run(run_dir)
    except MinisweError as error:
        fail(error)
    numbers = build_report(records, run)
    print(json.dumps(numbers, indent=2) if as_json else visible(render_markdown(numbers, records, run, os.path.abspath(run_dir))))


@app.command("inspect")
def inspect_command(
    paths: Annotated[list[str], typer.Argument(metavar="TRAJ|RUN_DIR...",
                                               help="A trajectory (miniswe or mini-swe-agent) or a batch run directory; two to compare.")],
    step: Annotated[Optional[int], typer.Option("--step", help="Show only step N.")] = None,
    steps: Annotated[Optional[str], typer.Option("--steps", help="Show steps A:B (inclusive; :B and A: too).")] = None,
    errors: Annotated[bool, typer.Option("--errors", help="Show only format errors, timeouts, aborted steps and non-zero exits.")] = False,
    full: Annotated[bool, typer.Option("--full", help="Show each output as stored, not as the model saw it.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the view as JSON (nothing else on stdout).")] = False,
    html: Annotated[Optional[str], typer.Option("--html", metavar="OUT.html", help="Write one self-contained HTML page instead.")] = None,
    sort: Annotated[Optional[str], typer.Option("--sort", metavar="COLUMN", help="Run directory: sort by id, status, resolved, steps, tokens, cost or wall (numbers largest first).")] = None,
    status: Annotated[Optional[str], typer.Option("--status", metavar="S", help="Run directory: only tasks with these exit statuses (comma-separated).")] = None,
    no_pager: Annotated[bool, typer.Option("--no-pager", help="Never page the output on a terminal.")] = False,
) -> None:
    """Show a recorded run or a batch, or compare two.

    A trajectory: header, then each step (thought, command, output, return code, duration). A run directory:
    one row per task. Two of either: where they differ. --html writes a page to open in a browser.
    """
    from miniswe.errors import MinisweError
    from miniswe.inspector import InspectOptions, inspect_paths

    options = InspectOptions(step=step, steps=steps, errors=errors, full=full, json=as_json, html=html, sort=sort,
                             status=status, pager=not no_pager)
    try:
        inspect_paths(paths, options)
    except MinisweError as error:
        fail(error)
    except KeyboardInterrupt:
        from miniswe.status import signal_exit_code

        raise typer.Exit(signal_exit_code("SIGINT")) from None


@app.command()
def export(
    trajectory: Annotated[str, typer.Argument(help="A trajectory file, or a batch run directory.")],
    format: Annotated[str, typer.Option("--format", help="The format to write: mini-swe-agent (trajectory_format mini-swe-agent-1.1).")] = "mini-swe-agent",
    output: Annotated[Optional[str], typer.Option("-o", "--output", help="A file (default X.mini.traj.json beside X.traj.json), or for a run directory a folder (default RUN_DIR.mini-swe-agent).")] = None,
) -> None:
    """Write a trajectory, or every task of a batch run directory, in mini-swe-agent's format.

    Exit codes: 0 written, 2 bad input (an unreadable trajectory, an unknown format), 3 the output could not be written.
    """
    from miniswe.errors import MinisweError
    from miniswe.mini_swe_agent import export as export_one, export_batch

    try:
        written = export_batch(trajectory, output, format) if os.path.isdir(trajectory) else [export_one(trajectory, output, format)]
    except MinisweError as error:
        fail(error)
    for path in written:
        print(path)


@app.command()
def merge(
    run_dirs: Annotated[list[str], typer.Argument(help="Run directories of the shards.")],
    output: Annotated[str, typer.Option("-o", "--output", help="New run directory for the merged run.")],
    force: Annotated[bool, typer.Option("--force", help="Merge runs of different task files or models; overwrite OUT.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the merged report as JSON.")] = False,
) -> None:
    """Combine shard run directories into one.

    One ledger, preds.json, report and set of trajectories; conflicting duplicates are refused.
    """
    import json

    from miniswe.batch.merge import merge_runs
    from miniswe.errors import MinisweError

    try:
        numbers, markdown = merge_runs(run_dirs, output, force=force)
    except MinisweError as error:
        fail(error)
    print(json.dumps(numbers, indent=2) if as_json else visible(markdown))


@app.command()
@with_flags("model", "base_url")
def demo(
    output: Annotated[Optional[str], typer.Option("-o", "--output", help="Run directory (default: a new trajectories/demo/<run id>).")] = None,
    workers: Annotated[int, typer.Option("-w", "--workers", help="Tasks run in parallel.")] = 4,
    quiet: Annotated[bool, typer.Option("-q", "--quiet", help="No progress; print one summary line instead of the report.")] = False,
    *,
    flags: dict,
) -> None:
    """Run the bundled demo tasks, offline by default.

    The batch runner with the scripted model, or a real model with --base-url and -m.
    """
    from miniswe.errors import MinisweError

    try:
        from miniswe.batch.run import BatchOptions
        from miniswe.resources import config_dir
        from miniswe.trajectory import new_run_id

        online = flags["model"] or flags["base_url"] or (os.environ.get("OPENAI_BASE_URL") and os.environ.get("MINISWE_MODEL"))
        if not online:  # the scripted model, with each demo task's own replies file, named after its id
            flags = {**flags, "script": os.path.join(config_dir(), "demo", "replies", "{id}.yaml")}
        cfg = resolve_config([], flags)
        # a fresh directory per invocation: running the demo again shows it again, rather than "all done"
        run_dir = output or os.path.join("trajectories", "demo", new_run_id())
        options = BatchOptions(os.path.join(config_dir(), "demo", "tasks.yaml"), run_dir, workers=workers, quiet=quiet,
                               command=_rerun_command("demo", output, run_dir))
        _run_batch(cfg, options)
    except MinisweError as error:
        fail(error)


def _run_batch(cfg, options) -> None:
    from miniswe.batch.run import run_batch

    try:
        result = run_batch(cfg, options)
    except KeyboardInterrupt:  # before the batch's own handlers are in place: nothing has started yet
        from miniswe.status import signal_exit_code

        raise typer.Exit(signal_exit_code("SIGINT")) from None
    if options.quiet:
        counts = " · ".join(f"{status} {count}" for status, count in result.report["by_status"].items())
        resolved = f" · resolved {result.report['resolved']}/{result.report['evaluated']}" if result.report["evaluated"] else ""
        print(f"{result.report['tasks']} tasks · {counts}{resolved} · {result.run_dir}", flush=True)
    else:
        print(visible(result.markdown), flush=True)
    raise typer.Exit(result.exit_code)


def _rerun_command(command: str, output: str | None, run_dir: str, fallback: list[str] = ()) -> str:
    """This command line as a user would type it again: without --redo/--force, with the run directory explicit."""
    import shlex

    given = sys.argv[2:] if sys.argv[1:2] == [command] else list(fallback)
    argv, skip = [], False
    for arg in given:
        if skip:
            skip = False
        elif arg in ("--redo", "--force"):
            skip = arg == "--redo"
        elif not arg.startswith(("--redo=", "--force")):
            argv.append(arg)
    if output is None:
        argv += ["-o", run_dir]
    from miniswe.redaction import mask_command_line

    return shlex.join(["miniswe", command, *mask_command_line(argv)])


@app.command()
def skill(
    name: Annotated[Optional[str], typer.Argument(help="A skill's name (without it: the list of skills).")] = None,
    file: Annotated[Optional[str], typer.Argument(help="A file of the skill's folder (default: its instructions, SKILL.md).")] = None,
    config: ConfigOpt = [],
) -> None:
    """Print a skill's instructions, a file of its folder, or the list of skills.

    The skills of agent.skills_dirs (-c), and in a command a miniswe run started, that run's. Exit codes: 0 printed,
    2 no such skill or file.
    """
    from miniswe.errors import MinisweError

    try:
        from miniswe.config import load_config
        from miniswe.skills import ENV_VAR, load_skills, read_skill

        dirs = [*load_config(*config).agent.skills_dirs, *filter(None, os.environ.get(ENV_VAR, "").split(os.pathsep))]
        skills, problems = load_skills(dirs)
        if name is None:
            for problem in problems:
                print(f"miniswe: {problem}", file=sys.stderr)
            for found in skills:
                print(f"{found.name}: {found.description}")
            if not skills:
                print("miniswe: no skills (set agent.skills_dirs)", file=sys.stderr)
            return
        text = read_skill(skills, name, file or "")
    except MinisweError as error:
        fail(error)
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


@app.command()
def cleanup(
    all_containers: Annotated[bool, typer.Option("--all", help="Remove every miniswe container, live owners' too.")] = False,
    executable: Annotated[str, typer.Option("--executable", help="docker or podman.")] = "docker",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List what would be removed.")] = False,
) -> None:
    """Remove containers left by dead miniswe runs.

    Those whose owning process is gone (after kill -9 or a crash); --all removes every one.
    """
    from miniswe.environments.containers import find_orphans, remove_containers
    from miniswe.errors import MinisweError

    try:
        found = find_orphans(executable, all=all_containers)
        for container in found:
            print(f"{container['name']}\trun {container['run']}\towner pid {container['pid']} on {container['host']}\t{container['state']}")
        removed = [] if dry_run else remove_containers([c["id"] for c in found], executable)
    except MinisweError as error:
        fail(error)
    what = "would remove" if dry_run else "removed"
    print(f"{what} {len(found) if dry_run else len(removed)} container(s)", file=sys.stderr)


def _warn_orphans(cfg) -> None:
    if cfg.environment.kind == "docker":
        from miniswe.environments.containers import warn_orphans

        warn_orphans([cfg.environment.executable])


def main(help_request: HelpRequest | None = None) -> None:
    """Run the command line; `help_request` (from miniswe/__main__.py) keeps the help it prints."""
    guard_streams()
    narrowed = _narrowed(sys.argv[1:2])
    if help_request is None:
        narrowed()
        return
    with help_request.recording():
        narrowed()


def _narrowed(first: list[str]) -> typer.Typer:
    """The app holding only the command `first` names: typer reads the signature of every command when it
    builds them (30 ms for these 13 here), and one runs. Anything else (no command, an option, a typo) gets
    the whole app, whose help and suggestions name them all."""
    from typer.main import get_command_name

    chosen = [info for info in app.registered_commands
              if first and (info.name or get_command_name(info.callback.__name__)) == first[0]]
    if not chosen:
        return app
    narrowed = copy.copy(app)
    narrowed.registered_commands = chosen
    narrowed.callback()(_group)  # a group still, as with all of them: `miniswe run TASK`, not `miniswe TASK`
    return narrowed


def _group() -> None:
    """miniswe: a small coding agent that runs one shell command per model reply."""
