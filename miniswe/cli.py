"""The command line. Thin: each command imports what it runs, so `miniswe --help` loads typer only."""

from __future__ import annotations

import os
import signal
import sys
from typing import Annotated, Optional

import typer

app = typer.Typer(
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    add_completion=False,
    rich_markup_mode=None,
    help="miniswe: a small coding agent that runs one shell command per model reply.",
)

ConfigOpt = Annotated[list[str], typer.Option("-c", "--config", metavar="FILE|KEY=VALUE", help="YAML file or key.path=value; repeatable, merged left to right.")]
ModelOpt = Annotated[Optional[str], typer.Option("-m", "--model", help="Model name (default: model.name, or $MINISWE_MODEL).")]
BaseUrlOpt = Annotated[Optional[str], typer.Option("--base-url", help="OpenAI-compatible endpoint (default: $OPENAI_BASE_URL, else model.base_url).")]
StepOpt = Annotated[Optional[int], typer.Option("--step-limit", help="Model calls per run (0 = unlimited).")]
TokenOpt = Annotated[Optional[int], typer.Option("--token-limit", help="Total tokens per run (0 = unlimited).")]
CostOpt = Annotated[Optional[float], typer.Option("--cost-limit", help="USD per run (0 = unlimited).")]
TimeOpt = Annotated[Optional[float], typer.Option("--time-limit", help="Wall seconds per run (0 = unlimited).")]
EnvOpt = Annotated[Optional[str], typer.Option("--env", help="Environment kind: local or docker.")]
ImageOpt = Annotated[Optional[str], typer.Option("--image", help="Docker image (implies --env docker).")]
QuietOpt = Annotated[bool, typer.Option("-q", "--quiet", help="Print only the final line.")]


def fail(error: Exception) -> None:
    """One line on stderr, then the exit code of the error's class."""
    print(f"miniswe: {error}", file=sys.stderr)
    raise typer.Exit(getattr(error, "exit_code", 3))


def _sigterm_as_interrupt() -> None:
    from miniswe.agent import Interrupt

    def handler(signum, frame):
        raise Interrupt("SIGTERM")

    signal.signal(signal.SIGTERM, handler)


def resolve_config(
    sources: list[str], *, model=None, base_url=None, step_limit=None, token_limit=None, cost_limit=None,
    time_limit=None, env=None, image=None, cwd=None, script=None,
):
    """Defaults, then -c sources, then flags. $OPENAI_BASE_URL and $MINISWE_MODEL fill what config leaves empty."""
    from miniswe.config import load_config, override

    flags: dict = {"model": {}, "agent": {}, "environment": {}}
    if base_url:
        flags["model"]["base_url"] = base_url
    if model:
        flags["model"]["name"] = model
    if script:
        flags["model"].update(kind="scripted", script=script)
    for key, value in (("step_limit", step_limit), ("token_limit", token_limit),
                       ("cost_limit", cost_limit), ("time_limit", time_limit)):
        if value is not None:
            flags["agent"][key] = value
    if image:
        flags["environment"].update(kind="docker", image=image)
    if env:
        flags["environment"]["kind"] = env
    if cwd:
        flags["environment"]["cwd"] = cwd
    config = load_config(*sources, {name: values for name, values in flags.items() if values})
    from_env = {}
    if not config.model.base_url and os.environ.get("OPENAI_BASE_URL"):
        from_env["base_url"] = os.environ["OPENAI_BASE_URL"]
    if not config.model.name and os.environ.get("MINISWE_MODEL"):
        from_env["name"] = os.environ["MINISWE_MODEL"]
    return override(config, model=from_env) if from_env else config


@app.command()
def run(
    task: Annotated[Optional[str], typer.Argument(help="The task text (or use --task-file).")] = None,
    task_file: Annotated[Optional[str], typer.Option("--task-file", "-t", help="Read the task text from a file.")] = None,
    config: ConfigOpt = [],
    model: ModelOpt = None,
    base_url: BaseUrlOpt = None,
    cwd: Annotated[Optional[str], typer.Option("--cwd", help="Working directory of the commands.")] = None,
    output: Annotated[Optional[str], typer.Option("-o", "--output", help="Trajectory path (default: trajectories/<run id>-<task>.traj.json).")] = None,
    step_limit: StepOpt = None,
    token_limit: TokenOpt = None,
    cost_limit: CostOpt = None,
    time_limit: TimeOpt = None,
    env: EnvOpt = None,
    image: ImageOpt = None,
    script: Annotated[Optional[str], typer.Option("--script", help="Use the scripted model with replies from this YAML/JSON file.")] = None,
    quiet: QuietOpt = False,
) -> None:
    """Solve one task, showing each step.

    Exit codes: 0 submitted, 1 stopped without submitting, 2 bad input, 3 infrastructure failure,
    130/143 interrupted.
    """
    from miniswe.errors import MinisweError, UsageError
    from miniswe.status import exit_code

    try:
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
        cfg = resolve_config(config, model=model, base_url=base_url, step_limit=step_limit, token_limit=token_limit,
                             cost_limit=cost_limit, time_limit=time_limit, env=env, image=image, cwd=cwd, script=script)
        from miniswe.display import make_display, summary_line
        from miniswe.runner import check_ready, default_trajectory_path, new_run_id, run_task

        renderer = check_ready(cfg)
        _warn_orphans(cfg)
        run_id = new_run_id()
        path = output or default_trajectory_path(task, run_id)
        if os.path.isdir(path):
            raise UsageError(f"-o {path}: is a directory; give a file path such as {os.path.join(path, 'run.traj.json')}")
        display = make_display(quiet)
        _sigterm_as_interrupt()
        from miniswe.models.gate import CallGate

        notify = None if quiet else (lambda message: print(f"miniswe: {message}", file=sys.stderr, flush=True))
        gate = CallGate(on_retry=notify)
        result = run_task(cfg, task, path, run_id=run_id, renderer=renderer, on_step=display.step, gate=gate)
    except MinisweError as error:
        fail(error)
    detail = result.outcome.detail
    if detail and result.outcome.status.value in ("ModelError", "SandboxError", "LimitsExceeded", "TimeExceeded", "RepeatedFormatError", "Interrupted"):
        print(f"miniswe: {result.outcome.status}: {detail.splitlines()[-1] if detail else ''}", file=sys.stderr)
    elif result.outcome.status.value == "Error":
        print(f"miniswe: internal error (traceback saved in {result.trajectory.path}): {detail.strip().splitlines()[-1]}", file=sys.stderr)
    display.final(summary_line(result))
    raise typer.Exit(exit_code(result.outcome.status, result.outcome.detail))


@app.command()
def batch(
    tasks: Annotated[str, typer.Argument(help="Task file: YAML/JSON list or JSONL (also SWE-bench instances).")],
    output: Annotated[Optional[str], typer.Option("-o", "--output", help="Run directory (default: trajectories/<task file name>).")] = None,
    workers: Annotated[int, typer.Option("-w", "--workers", help="Tasks run in parallel.")] = 1,
    config: ConfigOpt = [],
    model: ModelOpt = None,
    base_url: BaseUrlOpt = None,
    step_limit: StepOpt = None,
    token_limit: TokenOpt = None,
    cost_limit: CostOpt = None,
    time_limit: TimeOpt = None,
    env: EnvOpt = None,
    image: ImageOpt = None,
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
) -> None:
    """Run a task list in parallel, resumably.

    Exit codes: 0 every task ended by the agent, 3 infrastructure failures, 2 bad input, 130/143 interrupted.
    """
    from miniswe.errors import MinisweError

    try:
        cfg = resolve_config(config, model=model, base_url=base_url, step_limit=step_limit, token_limit=token_limit,
                             cost_limit=cost_limit, time_limit=time_limit, env=env, image=image)
        from miniswe.batch.run import BatchOptions, default_run_dir

        options = BatchOptions(
            tasks, output, workers=workers, filter=filter, slice=slice, shuffle=shuffle, seed=seed, shard=shard,
            redo=redo, force=force, max_concurrent_calls=max_concurrent_calls, batch_cost_limit=batch_cost_limit,
            batch_token_limit=batch_token_limit, quiet=quiet,
            command=_rerun_command("batch", output, default_run_dir(tasks, shard), fallback=[tasks]),
        )
        _run_batch(cfg, options)
    except MinisweError as error:
        fail(error)


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
    numbers = build_report(records)
    print(json.dumps(numbers, indent=2) if as_json else render_markdown(numbers, records, run, os.path.abspath(run_dir)))


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
    print(json.dumps(numbers, indent=2) if as_json else markdown)


@app.command()
def demo(
    model: ModelOpt = None,
    base_url: BaseUrlOpt = None,
    output: Annotated[Optional[str], typer.Option("-o", "--output", help="Run directory (default: a new trajectories/demo/<run id>).")] = None,
    workers: Annotated[int, typer.Option("-w", "--workers", help="Tasks run in parallel.")] = 4,
    quiet: Annotated[bool, typer.Option("-q", "--quiet", help="No progress; print one summary line instead of the report.")] = False,
) -> None:
    """Run the bundled demo tasks, offline by default.

    The batch runner with the scripted model, or a real model with --base-url and -m.
    """
    from miniswe.errors import MinisweError

    try:
        from miniswe.batch.run import BatchOptions
        from miniswe.config import override
        from miniswe.resources import config_dir
        from miniswe.runner import new_run_id

        cfg = resolve_config([], model=model, base_url=base_url)
        online = model or base_url or (os.environ.get("OPENAI_BASE_URL") and os.environ.get("MINISWE_MODEL"))
        if not online:
            cfg = override(cfg, model={"kind": "scripted"})  # each demo task names its own replies file
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
        raise typer.Exit(130) from None
    if options.quiet:
        counts = " · ".join(f"{status} {count}" for status, count in result.report["by_status"].items())
        resolved = f" · resolved {result.report['resolved']}/{result.report['evaluated']}" if result.report["evaluated"] else ""
        print(f"{result.report['tasks']} tasks · {counts}{resolved} · {result.run_dir}", flush=True)
    else:
        print(result.markdown, flush=True)
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
    from miniswe.redaction import mask_assignments

    return mask_assignments(shlex.join(["miniswe", command, *argv]))


@app.command()
def cleanup(
    all_containers: Annotated[bool, typer.Option("--all", help="Remove every miniswe container, live owners' too.")] = False,
    executable: Annotated[str, typer.Option("--executable", help="docker or podman.")] = "docker",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List what would be removed.")] = False,
) -> None:
    """Remove containers left by dead miniswe runs.

    Those whose owning process is gone (after kill -9 or a crash); --all removes every one.
    """
    from miniswe.environments.docker import find_orphans, remove_containers
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
        from miniswe.environments.docker import warn_orphans

        warn_orphans([cfg.environment.executable])


def main() -> None:
    app()
